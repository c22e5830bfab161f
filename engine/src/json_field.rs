//! Fields of JSON record values: a job file's named schema (`schema:` on a Kafka source),
//! dotted field paths into a JSON object, and the conditions of a `filter`'s `where`
//! (`field op value`). Pure: no I/O.
//!
//! ```yaml
//! kafka: { topic: tweets, bootstrapServers: "127.0.0.1:39092", keyBy: user, valueField: likes,
//!          schema: { name: tweet, fields: { user: string, likes: int, lang: string } } }
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The type of a schema field.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FieldType {
    /// A JSON string.
    String,
    /// A JSON integer (64-bit signed).
    Int,
    /// A JSON number (integer or not).
    Float,
    /// `true` or `false`.
    Bool,
}

impl FieldType {
    /// Whether values of this type are numbers (aggregated by `window`, compared with `<`).
    pub fn is_numeric(self) -> bool {
        matches!(self, FieldType::Int | FieldType::Float)
    }

    /// The name as written in a job file.
    pub fn name(self) -> &'static str {
        match self {
            FieldType::String => "string",
            FieldType::Int => "int",
            FieldType::Float => "float",
            FieldType::Bool => "bool",
        }
    }
}

/// A named schema of a topic's JSON values: field paths (`user`, `user.lang`) and their types.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Schema {
    /// The schema's name (letters, digits, `-`, `_`), used in error messages and metrics.
    pub name: String,
    /// Field path → type. At least one field.
    pub fields: BTreeMap<String, FieldType>,
}

impl Schema {
    /// The type of `path`, or an error naming the schema and its fields.
    ///
    /// # Errors
    /// A message when `path` is not one of the schema's fields.
    pub fn field(&self, path: &str) -> Result<FieldType, String> {
        self.fields.get(path).copied().ok_or_else(|| {
            format!(
                "field `{path}` is not in schema `{}` (its fields: {})",
                self.name,
                self.fields.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// Checks the schema itself: a name and at least one well-formed field path.
    ///
    /// # Errors
    /// A message naming what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "name: `{}` must be letters, digits, `-` and `_`",
                self.name
            ));
        }
        if self.fields.is_empty() {
            return Err("fields: a schema needs at least one field".into());
        }
        for path in self.fields.keys() {
            check_path(path).map_err(|e| format!("fields.{path}: {e}"))?;
        }
        Ok(())
    }
}

/// Checks a dotted field path: non-empty segments of letters, digits, `_` and `-`.
///
/// # Errors
/// A message naming the bad path.
pub fn check_path(path: &str) -> Result<(), String> {
    let ok = !path.is_empty()
        && path.split('.').all(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{path}` is not a field path (names of letters, digits, `_`, `-` joined by `.`)"
        ))
    }
}

/// The value at dotted `path` of a JSON object, if present (and not `null`).
pub fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    let mut at = value;
    for seg in path.split('.') {
        at = at.as_object()?.get(seg)?;
    }
    (!at.is_null()).then_some(at)
}

/// Why a record's value could not be used: counted as a dead letter
/// (`streamscale_records_invalid_total`), never silently dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// The value is not a JSON object (or there is no value).
    NotJson,
    /// The field is missing (or `null`).
    Missing(String),
    /// The field has another type than the schema or the condition needs.
    WrongType(String),
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::NotJson => write!(f, "value is not a JSON object"),
            Invalid::Missing(p) => write!(f, "field `{p}` is missing"),
            Invalid::WrongType(p) => write!(f, "field `{p}` has the wrong type"),
        }
    }
}

/// Parses a record's value bytes as a JSON object.
///
/// # Errors
/// [`Invalid::NotJson`] for anything else.
pub fn parse_object(bytes: Option<&[u8]>) -> Result<Value, Invalid> {
    let v: Value =
        serde_json::from_slice(bytes.ok_or(Invalid::NotJson)?).map_err(|_| Invalid::NotJson)?;
    if v.is_object() {
        Ok(v)
    } else {
        Err(Invalid::NotJson)
    }
}

/// The integer at `path` (a float is truncated toward zero; other types are
/// [`Invalid::WrongType`]).
///
/// # Errors
/// [`Invalid::Missing`] or [`Invalid::WrongType`].
pub fn int_at(value: &Value, path: &str) -> Result<i64, Invalid> {
    let v = lookup(value, path).ok_or_else(|| Invalid::Missing(path.into()))?;
    v.as_i64()
        .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
        .ok_or_else(|| Invalid::WrongType(path.into()))
}

/// The bytes a key is hashed from for the field at `path`: a string's characters, any other
/// value's JSON text (so `7` and `"7"` are different keys).
///
/// # Errors
/// [`Invalid::Missing`].
pub fn key_bytes(value: &Value, path: &str) -> Result<Vec<u8>, Invalid> {
    let v = lookup(value, path).ok_or_else(|| Invalid::Missing(path.into()))?;
    Ok(match v {
        Value::String(s) => s.as_bytes().to_vec(),
        other => other.to_string().into_bytes(),
    })
}

/// A comparison operator of a [`Condition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CompareOp {
    fn text(self) -> &'static str {
        match self {
            CompareOp::Eq => "==",
            CompareOp::Ne => "!=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
        }
    }

    fn holds(self, ord: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::{Equal, Greater, Less};
        match self {
            CompareOp::Eq => ord == Equal,
            CompareOp::Ne => ord != Equal,
            CompareOp::Lt => ord == Less,
            CompareOp::Le => ord != Greater,
            CompareOp::Gt => ord == Greater,
            CompareOp::Ge => ord != Less,
        }
    }
}

/// The constant a [`Condition`] compares with.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// A number (`50`, `-2.5`).
    Number(f64),
    /// A string (`"en"` or `'en'`, or a bare word such as `en`).
    Str(String),
    /// `true` or `false`.
    Bool(bool),
}

/// A `filter`'s `where`: `field op value`, e.g. `likes >= 50`, `lang == "en"`. Written as
/// one string in the job file.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// Dotted field path.
    pub field: String,
    /// Comparison.
    pub op: CompareOp,
    /// Constant compared with.
    pub value: Literal,
}

impl Condition {
    /// Parses `field op value` (spaces around `op` optional).
    ///
    /// # Errors
    /// A message naming what is wrong: no operator, a bad field path, an empty value, an
    /// ordering (`<`, `<=`, `>`, `>=`) on a boolean.
    pub fn parse(text: &str) -> Result<Condition, String> {
        let text = text.trim();
        // The first operator character; two-character operators first.
        let at = text.find(['=', '!', '<', '>']).ok_or_else(|| {
            format!("`{text}`: expected `field op value` with op one of ==, !=, <, <=, >, >=")
        })?;
        let rest = &text[at..];
        let op = [
            ("==", CompareOp::Eq),
            ("!=", CompareOp::Ne),
            ("<=", CompareOp::Le),
            (">=", CompareOp::Ge),
            ("<", CompareOp::Lt),
            (">", CompareOp::Gt),
        ]
        .into_iter()
        .find(|(t, _)| rest.starts_with(t))
        .ok_or_else(|| format!("`{text}`: unknown operator (one of ==, !=, <, <=, >, >=)"))?;
        let field = text[..at].trim();
        check_path(field).map_err(|e| format!("`{text}`: {e}"))?;
        let raw = rest[op.0.len()..].trim();
        if raw.is_empty() {
            return Err(format!("`{text}`: no value after `{}`", op.0));
        }
        let value = if let Some(s) = raw
            .strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .or_else(|| raw.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))
        {
            Literal::Str(s.to_string())
        } else if raw == "true" || raw == "false" {
            Literal::Bool(raw == "true")
        } else if let Ok(n) = raw.parse::<f64>() {
            if !n.is_finite() {
                return Err(format!("`{text}`: `{raw}` is not a finite number"));
            }
            Literal::Number(n)
        } else if raw
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            Literal::Str(raw.to_string())
        } else {
            return Err(format!(
                "`{text}`: `{raw}` is not a value (a number, true/false, a word or a quoted string)"
            ));
        };
        if matches!(value, Literal::Bool(_)) && !matches!(op.1, CompareOp::Eq | CompareOp::Ne) {
            return Err(format!("`{text}`: booleans compare with == or != only"));
        }
        Ok(Condition {
            field: field.to_string(),
            op: op.1,
            value,
        })
    }

    /// Checks the condition against the type of its field in `schema`.
    ///
    /// # Errors
    /// A message when the field is not in the schema or its type does not match the value.
    pub fn check(&self, schema: &Schema) -> Result<(), String> {
        let t = schema.field(&self.field)?;
        let fits = match &self.value {
            Literal::Number(_) => t.is_numeric(),
            Literal::Str(_) => t == FieldType::String,
            Literal::Bool(_) => t == FieldType::Bool,
        };
        if fits {
            Ok(())
        } else {
            Err(format!(
                "`{self}`: field `{}` is {} in schema `{}`, not comparable with {}",
                self.field,
                t.name(),
                schema.name,
                match &self.value {
                    Literal::Number(_) => "a number",
                    Literal::Str(_) => "a string",
                    Literal::Bool(_) => "a boolean",
                }
            ))
        }
    }

    /// Whether the JSON object `value` satisfies the condition.
    ///
    /// # Errors
    /// [`Invalid::Missing`] when the field is absent, [`Invalid::WrongType`] when it cannot be
    /// compared with the constant (a string against a number, ...).
    pub fn eval(&self, value: &Value) -> Result<bool, Invalid> {
        let v = lookup(value, &self.field).ok_or_else(|| Invalid::Missing(self.field.clone()))?;
        self.holds_for(v.as_f64(), v.as_str(), v.as_bool())
    }

    /// Whether the condition holds for a field value that is the number `num`, the string
    /// `text` or the boolean `flag` (at most one of them given; none: another type).
    ///
    /// # Errors
    /// [`Invalid::WrongType`] when the value's type does not fit the constant's.
    fn holds_for(
        &self,
        num: Option<f64>,
        text: Option<&str>,
        flag: Option<bool>,
    ) -> Result<bool, Invalid> {
        let wrong = || Invalid::WrongType(self.field.clone());
        let ord = match &self.value {
            Literal::Number(n) => num.ok_or_else(wrong)?.partial_cmp(n).ok_or_else(wrong)?,
            Literal::Str(s) => text.ok_or_else(wrong)?.cmp(s.as_str()),
            Literal::Bool(b) => flag.ok_or_else(wrong)?.cmp(b),
        };
        Ok(self.op.holds(ord))
    }
}

/// A [`Condition`] evaluated on JSON value bytes: reads only the condition's field, in one
/// pass without building a [`Value`] tree ([`crate::json_extract::FieldPaths`]), with the
/// same result as [`Condition::eval`] on the parsed object.
#[derive(Debug, Clone)]
pub struct ConditionReader {
    condition: Condition,
    /// The field's path (`None`: not readable in one pass; the value is parsed instead).
    paths: Option<crate::json_extract::FieldPaths>,
}

impl ConditionReader {
    /// The reader of `condition`'s field.
    pub fn new(condition: Condition) -> ConditionReader {
        let paths = crate::json_extract::FieldPaths::dotted(&[condition.field.as_str()]).ok();
        ConditionReader { condition, paths }
    }

    /// Whether the condition holds for the JSON object `bytes`.
    ///
    /// # Errors
    /// As [`parse_object`] and [`Condition::eval`].
    pub fn eval(&self, bytes: Option<&[u8]>) -> Result<bool, Invalid> {
        use crate::json_extract::Leaf;
        let Some(paths) = &self.paths else {
            return self.condition.eval(&parse_object(bytes)?);
        };
        let mut out = [None];
        paths.read(bytes.ok_or(Invalid::NotJson)?, &mut out)?;
        let c = &self.condition;
        match &out[0] {
            None => Err(Invalid::Missing(c.field.clone())),
            Some(Leaf::Number(n)) => c.holds_for(n.as_f64(), None, None),
            Some(Leaf::Str(s)) => c.holds_for(None, Some(s), None),
            Some(Leaf::Bool(b)) => c.holds_for(None, None, Some(*b)),
            Some(Leaf::Composite(_)) => c.holds_for(None, None, None),
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.field, self.op.text())?;
        match &self.value {
            Literal::Number(n) => write!(f, "{n}"),
            Literal::Str(s) => write!(f, "{s:?}"),
            Literal::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl Serialize for Condition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Condition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Condition::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Condition {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Condition".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema {
            name: "tweet".into(),
            fields: [
                ("user".to_string(), FieldType::String),
                ("likes".to_string(), FieldType::Int),
                ("geo.lat".to_string(), FieldType::Float),
                ("rt".to_string(), FieldType::Bool),
            ]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn paths_reach_nested_fields_and_null_is_missing() {
        let v = json!({"user": "ann", "geo": {"lat": 1.5}, "n": null});
        assert_eq!(lookup(&v, "geo.lat"), Some(&json!(1.5)));
        assert_eq!(lookup(&v, "geo.lon"), None);
        assert_eq!(lookup(&v, "user.x"), None);
        assert_eq!(lookup(&v, "n"), None);
        assert_eq!(key_bytes(&v, "user"), Ok(b"ann".to_vec()));
        assert_eq!(key_bytes(&v, "geo"), Ok(br#"{"lat":1.5}"#.to_vec()));
        assert_eq!(int_at(&v, "geo.lat"), Ok(1));
        assert_eq!(int_at(&v, "user"), Err(Invalid::WrongType("user".into())));
        assert_eq!(int_at(&v, "likes"), Err(Invalid::Missing("likes".into())));
        assert!(check_path("a..b").is_err());
        assert!(check_path("a b").is_err());
        assert!(check_path("a.b_c-1").is_ok());
    }

    #[test]
    fn values_that_are_not_json_objects_are_invalid() {
        assert_eq!(parse_object(Some(b"nope")), Err(Invalid::NotJson));
        assert_eq!(parse_object(Some(b"[1]")), Err(Invalid::NotJson));
        assert_eq!(parse_object(None), Err(Invalid::NotJson));
        assert_eq!(parse_object(Some(br#"{"a":1}"#)), Ok(json!({"a": 1})));
    }

    #[test]
    fn conditions_parse_and_evaluate_every_operator() {
        let v = json!({"user": "bob", "likes": 50, "geo": {"lat": -2.5}, "rt": true});
        let holds = |c: &str| Condition::parse(c).unwrap().eval(&v).unwrap();
        assert!(holds("likes >= 50"));
        assert!(!holds("likes > 50"));
        assert!(holds("likes<=50"));
        assert!(!holds("likes < 50"));
        assert!(holds("likes == 50.0"));
        assert!(holds("likes != 49"));
        assert!(holds("geo.lat < -2"));
        assert!(holds(r#"user == "bob""#));
        assert!(holds("user == 'bob'"));
        assert!(holds("user == bob"));
        assert!(holds("user > alice"));
        assert!(holds("rt == true"));
        assert!(!holds("rt != true"));
        let c = Condition::parse("missing > 1").unwrap();
        assert_eq!(c.eval(&v), Err(Invalid::Missing("missing".into())));
        let c = Condition::parse("user > 1").unwrap();
        assert_eq!(c.eval(&v), Err(Invalid::WrongType("user".into())));
        // Round trip through the job file's text.
        let c = Condition::parse(r#"user=="bob""#).unwrap();
        assert_eq!(Condition::parse(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn bad_conditions_are_clear_errors() {
        for (text, needle) in [
            ("likes 50", "expected `field op value`"),
            ("likes >= ", "no value after `>=`"),
            ("li kes >= 1", "is not a field path"),
            (">= 1", "is not a field path"),
            ("rt < true", "booleans compare with == or != only"),
            ("likes =! 1", "unknown operator"),
        ] {
            let e = Condition::parse(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn conditions_are_checked_against_the_schema() {
        let s = schema();
        assert!(Condition::parse("likes > 3").unwrap().check(&s).is_ok());
        assert!(Condition::parse("geo.lat > 3").unwrap().check(&s).is_ok());
        let e = Condition::parse("user > 3").unwrap().check(&s).unwrap_err();
        assert!(
            e.contains("field `user` is string in schema `tweet`"),
            "{e}"
        );
        let e = Condition::parse("lang == en")
            .unwrap()
            .check(&s)
            .unwrap_err();
        assert!(e.contains("field `lang` is not in schema `tweet`"), "{e}");
        assert!(s.validate().is_ok());
        let mut bad = s.clone();
        bad.fields.insert("a..b".into(), FieldType::Int);
        assert!(bad.validate().unwrap_err().contains("fields.a..b"));
    }

    proptest::proptest! {
        /// A condition read in one pass agrees with the condition on the parsed object: every
        /// field type, nested paths, escapes, duplicate fields (the last counts), `null`,
        /// values that are not objects or not JSON.
        #[test]
        fn condition_reader_agrees_with_the_value_tree(
            v in proptest::sample::select(vec![
                "7", "7.5", "-1", "0", r#""ann""#, r#""a\u006en""#, "true", "false", "null",
                "[1]", r#"{"n":1}"#, "1e400",
            ]),
            shape in 0..7usize,
            cond in proptest::sample::select(vec![
                "n == 7", "n > 7", "n != 7.5", "n <= -1", r#"n == "ann""#, "n < b", "n == true",
                "n != false", "u.n >= 0", r#"u.n == "ann""#, "u.n != true",
            ]),
        ) {
            let text = match shape {
                0 => format!(r#"{{"n": {v}}}"#),
                1 => format!(r#"{{"u": {{"n": {v}}}, "n": {v}}}"#),
                2 => format!(r#"{{"n": 1, "u": {{"n": "x", "n": {v}}}, "n": {v}}}"#),
                3 => format!(r#"{{"u": 5, "\u006e": {v}, "u": {{"n": {v}}}}}"#),
                4 => format!(r#"{{"n": {v}, "u": {{"n": {v}}}, "n": null}}"#),
                5 => v.to_string(),
                _ => format!(r#"{{"n": {v}"#),
            };
            let c = Condition::parse(cond).unwrap();
            let tree = parse_object(Some(text.as_bytes())).and_then(|o| c.eval(&o));
            proptest::prop_assert_eq!(
                ConditionReader::new(c).eval(Some(text.as_bytes())),
                tree,
                "{}",
                text
            );
        }
    }

    #[test]
    fn condition_reader_needs_a_value() {
        let c = ConditionReader::new(Condition::parse("n > 1").unwrap());
        assert_eq!(c.eval(None), Err(Invalid::NotJson));
        assert_eq!(c.eval(Some(br#"{"n": 2}"#)), Ok(true));
        assert_eq!(
            c.eval(Some(br#"{"m": 2}"#)),
            Err(Invalid::Missing("n".into()))
        );
    }
}
