//! Reading a few fields of a JSON object (a Kafka record's value) in one pass, without
//! building a [`serde_json::Value`] tree: fields that are not asked for are checked and
//! skipped, strings are borrowed from the input where they have no escapes. Same answers as
//! parsing into a `Value` and looking the paths up ([`crate::json_field::lookup`]): the whole
//! input must be valid JSON (strings, escapes, number ranges, nesting depth), a duplicated
//! key's last value counts, `null` is missing. Pure: no I/O.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

use crate::json_field::Invalid;

mod plain;

/// The most paths one [`FieldPaths`] reads.
pub const MAX_PATHS: usize = 64;

/// The value found at one field path (never `null`: a `null` field is absent).
#[derive(Debug, Clone, PartialEq)]
pub enum Leaf<'de> {
    /// `true` or `false`.
    Bool(bool),
    /// A number, as `serde_json` reads it (integer or float).
    Number(Number),
    /// A string, borrowed from the input when it has no escapes.
    Str(Cow<'de, str>),
    /// An object or an array.
    Composite(Value),
}

impl Leaf<'_> {
    /// The value as a [`serde_json::Value`].
    pub fn to_value(&self) -> Value {
        match self {
            Leaf::Bool(b) => Value::Bool(*b),
            Leaf::Number(n) => Value::Number(n.clone()),
            Leaf::Str(s) => Value::String(s.to_string()),
            Leaf::Composite(v) => v.clone(),
        }
    }

    /// The integer this value stands for, as [`crate::json_field::int_at`]: an integer, or a
    /// finite float truncated toward zero; `None` for other types.
    pub fn int(&self) -> Option<i64> {
        match self {
            Leaf::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(|f| f as i64)),
            _ => None,
        }
    }

    /// The bytes a key is hashed from, as [`crate::json_field::key_bytes`]: a string's
    /// characters, any other value's JSON text.
    pub fn key_bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Leaf::Str(s) => Cow::Borrowed(s.as_bytes()),
            other => Cow::Owned(other.to_value().to_string().into_bytes()),
        }
    }
}

/// Field paths read together from JSON objects: each a list of names (`user.id` is
/// `["user", "id"]`). No two paths are equal and none is a prefix of another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPaths {
    paths: Vec<Vec<String>>,
}

/// Why a set of paths cannot be read by one [`FieldPaths`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathsError {
    /// No paths, or more than [`MAX_PATHS`].
    #[error("between 1 and {MAX_PATHS} paths are read at once, not {0}")]
    Count(usize),
    /// A path without names.
    #[error("a path has no names")]
    Empty,
    /// Two paths are equal, or one is the start of the other.
    #[error("path `{0}` is or starts path `{1}`")]
    Overlap(String, String),
}

impl FieldPaths {
    /// Paths given as lists of names.
    ///
    /// # Errors
    /// [`PathsError`]: none or too many paths, an empty path, overlapping paths.
    pub fn new(paths: Vec<Vec<String>>) -> Result<FieldPaths, PathsError> {
        if paths.is_empty() || paths.len() > MAX_PATHS {
            return Err(PathsError::Count(paths.len()));
        }
        if paths.iter().any(Vec::is_empty) {
            return Err(PathsError::Empty);
        }
        for (i, a) in paths.iter().enumerate() {
            for b in &paths[i + 1..] {
                let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
                if long.starts_with(short) {
                    return Err(PathsError::Overlap(short.join("."), long.join(".")));
                }
            }
        }
        Ok(FieldPaths { paths })
    }

    /// Dotted paths (`user.id`), split at every `.`.
    ///
    /// # Errors
    /// As [`FieldPaths::new`].
    pub fn dotted(paths: &[&str]) -> Result<FieldPaths, PathsError> {
        FieldPaths::new(
            paths
                .iter()
                .map(|p| p.split('.').map(str::to_string).collect())
                .collect(),
        )
    }

    /// How many paths there are (the length `out` of [`FieldPaths::read`] must have).
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Always false: there is at least one path.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Reads `bytes` as one JSON object and sets `out[i]` to the value at path `i` (`None`
    /// when it is missing or `null`, or when a name on the way is not an object).
    ///
    /// # Errors
    /// [`Invalid::NotJson`] when `bytes` is not exactly one valid JSON value that is an
    /// object.
    ///
    /// # Panics
    /// When `out.len()` is not [`FieldPaths::len`].
    pub fn read<'de>(
        &self,
        bytes: &'de [u8],
        out: &mut [Option<Leaf<'de>>],
    ) -> Result<(), Invalid> {
        assert_eq!(out.len(), self.paths.len(), "one output per path");
        out.iter_mut().for_each(|o| *o = None);
        if plain::read(&self.paths, bytes, out).is_some() {
            return Ok(());
        }
        out.iter_mut().for_each(|o| *o = None);
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let node = Node {
            paths: &self.paths,
            depth: 0,
            active: all_bits(self.paths.len()),
            out,
        };
        match node.deserialize(&mut de) {
            Ok(true) => de.end().map_err(|_| Invalid::NotJson),
            Ok(false) | Err(_) => Err(Invalid::NotJson),
        }
    }
}

fn all_bits(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// Bits of `mask`, lowest first.
fn bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            i
        })
    })
}

/// A value on the way to the paths in `active` (bit i: path i), `depth` names below the
/// top. Yields whether it was an object.
struct Node<'a, 'p, 'de> {
    paths: &'p [Vec<String>],
    depth: usize,
    active: u64,
    out: &'a mut [Option<Leaf<'de>>],
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_, 'de> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_, 'de> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let Node {
            paths,
            depth,
            active,
            out,
        } = self;
        while let Some(sub) = map.next_key_seed(Key {
            paths,
            depth,
            active,
        })? {
            if sub == 0 {
                map.next_value_seed(Skip)?;
                continue;
            }
            // Paths neither repeat nor start one another: a path ending here is alone.
            let first = sub.trailing_zeros() as usize;
            if paths[first].len() == depth + 1 {
                out[first] = map.next_value_seed(LeafSeed)?;
            } else {
                // A repeated key: its last value counts, found or not.
                bits(sub).for_each(|i| out[i] = None);
                map.next_value_seed(Node {
                    paths,
                    depth: depth + 1,
                    active: sub,
                    out: &mut *out,
                })?;
            }
        }
        Ok(true)
    }
}

/// An object's key: which of the `active` paths continue through it.
struct Key<'p> {
    paths: &'p [Vec<String>],
    depth: usize,
    active: u64,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Key<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<u64, E> {
        Ok(bits(self.active)
            .filter(|&i| self.paths[i][self.depth] == key)
            .fold(0, |m, i| m | (1 << i)))
    }
}

/// The value at the end of a path.
struct LeafSeed;

impl<'de> DeserializeSeed<'de> for LeafSeed {
    type Value = Option<Leaf<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LeafSeed {
    type Value = Option<Leaf<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(Leaf::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(Leaf::Number(v.into())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(Leaf::Number(v.into())))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        // As `Value`: a float that is not a JSON number is null.
        Ok(Number::from_f64(v).map(Leaf::Number))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Leaf::Str(Cow::Borrowed(v))))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Leaf::Str(Cow::Owned(v.to_string()))))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Some(Leaf::Str(Cow::Owned(v))))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Value::deserialize(SeqAccessDeserializer::new(seq)).map(|v| Some(Leaf::Composite(v)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Value::deserialize(MapAccessDeserializer::new(map)).map(|v| Some(Leaf::Composite(v)))
    }
}

/// A value no path needs: read as fully as a `Value` would be (so the same inputs are
/// refused) and dropped.
struct Skip;

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Skip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(Skip)?.is_some() {
            map.next_value_seed(Skip)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_field::{int_at, key_bytes, lookup, parse_object};
    use proptest::prelude::*;

    /// The `Value`-based answers for `paths`: per path, the value (or `None`), or `NotJson`.
    fn by_tree(bytes: &[u8], paths: &[&str]) -> Result<Vec<Option<Value>>, Invalid> {
        let v = parse_object(Some(bytes))?;
        Ok(paths.iter().map(|p| lookup(&v, p).cloned()).collect())
    }

    fn fast(bytes: &[u8], paths: &[&str]) -> Result<Vec<Option<Value>>, Invalid> {
        let fp = FieldPaths::dotted(paths).unwrap();
        let mut out = vec![None; paths.len()];
        fp.read(bytes, &mut out)?;
        Ok(out.iter().map(|o| o.as_ref().map(Leaf::to_value)).collect())
    }

    fn agree(text: &str, paths: &[&str]) {
        let bytes = text.as_bytes();
        assert_eq!(fast(bytes, paths), by_tree(bytes, paths), "{text}");
        // int_at and key_bytes agree too.
        if let Ok(v) = parse_object(Some(bytes)) {
            let fp = FieldPaths::dotted(paths).unwrap();
            let mut out = vec![None; paths.len()];
            fp.read(bytes, &mut out).unwrap();
            for (p, leaf) in paths.iter().zip(&out) {
                let int = leaf.as_ref().map(Leaf::int);
                let want = int_at(&v, p);
                match (&want, int) {
                    (Ok(n), Some(Some(m))) => assert_eq!(*n, m, "{text} {p}"),
                    (Err(Invalid::WrongType(_)), Some(None)) | (Err(Invalid::Missing(_)), None) => {
                    }
                    _ => panic!("{text} {p}: {want:?} vs {int:?}"),
                }
                assert_eq!(
                    key_bytes(&v, p).ok(),
                    leaf.as_ref().map(|l| l.key_bytes().into_owned()),
                    "{text} {p}"
                );
            }
        }
    }

    #[test]
    fn fields_agree_with_the_value_tree() {
        let paths = ["user.id", "n"];
        for text in [
            r#"{"user": {"id": "ann"}, "n": 7}"#,
            r#"{"user": {"id": 7}, "n": "7"}"#,
            r#"{"user": {"id": {"b": 1, "a": [1, 2.5]}}, "n": 1.9}"#,
            r#"{"user": {"id": true}, "n": -1.9}"#,
            r#"{"user": {"id": null}, "n": null}"#,
            r#"{"user": "id", "n": [1]}"#,
            r#"{"user": {"id": "a\"b\u00e9\n"}, "n": 1e3}"#,
            r#"{"u\u0073er": {"\u0069d": "esc"}, "n": -0}"#,
            r#"{"n": 18446744073709551615, "user": {"x": 1}}"#,
            r#"{"n": -9223372036854775808, "user": []}"#,
            r#"{"n": 1, "n": 2, "user": {"id": "a"}, "user": {"x": 1}}"#,
            r#"{"n": 1, "n": null, "user": {"id": "a"}, "user": {"id": "b", "id": "c"}}"#,
            r#"{"user": {"id": "a"}, "user": 3}"#,
            r#"{"other": {"id": "x", "deep": [[[{"a": "\ud83d\ude00"}]]]}, "n": 2}"#,
            r#"{}"#,
            "  {\"n\" : 5 }  ",
        ] {
            agree(text, &paths);
        }
        agree(r#"{"a": {"b": {"c": 1}}, "a.b": 2}"#, &["a.b.c", "a.b.d"]);
    }

    #[test]
    fn inputs_a_value_tree_refuses_are_refused() {
        let paths = ["user.id", "n"];
        for text in [
            "",
            "nope",
            "[1]",
            "7",
            "null",
            r#"{"n": 1} x"#,
            r#"{"n": 1}{"n": 2}"#,
            r#"{"n": 1,}"#,
            r#"{"x": "\ud800"}"#,
            r#"{"x": "\q"}"#,
            r#"{"x": 1e400}"#,
            "{\"x\": \"a\u{1}b\"}",
            r#"{"x": [1, 2}"#,
            r#"{"n": 01}"#,
        ] {
            assert_eq!(
                fast(text.as_bytes(), &paths),
                Err(Invalid::NotJson),
                "{text}"
            );
            assert_eq!(
                by_tree(text.as_bytes(), &paths),
                Err(Invalid::NotJson),
                "{text}"
            );
        }
        let bad_utf8 = b"{\"x\": \"\xff\", \"n\": 1}";
        assert_eq!(fast(bad_utf8, &paths), Err(Invalid::NotJson));
        assert_eq!(by_tree(bad_utf8, &paths), Err(Invalid::NotJson));
        let deep = format!("{{\"x\": {}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(fast(deep.as_bytes(), &paths), Err(Invalid::NotJson));
        assert_eq!(by_tree(deep.as_bytes(), &paths), Err(Invalid::NotJson));
    }

    #[test]
    fn overlapping_paths_are_refused() {
        assert!(matches!(
            FieldPaths::dotted(&["a", "a.b"]),
            Err(PathsError::Overlap(..))
        ));
        assert!(matches!(
            FieldPaths::dotted(&["a.b", "a.b"]),
            Err(PathsError::Overlap(..))
        ));
        assert!(FieldPaths::dotted(&["a.b", "a.c", "ab"]).is_ok());
        assert_eq!(FieldPaths::new(vec![]), Err(PathsError::Count(0)));
    }

    /// JSON values over a few names, nested, with escapes, duplicates and numbers of
    /// every kind.
    fn json_text() -> impl Strategy<Value = String> {
        let name = prop::sample::select(vec!["a", "b", "c", "\\u0061", "a\\\"", "id"]);
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
            prop::sample::select(vec!["-0", "1e3", "2.5E-3", "1e400", "01", "-"])
                .prop_map(String::from),
            "[a-z\\\\\"é]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            prop::sample::select(vec![r#""\u00e9""#, r#""\ud800""#, r#""\n7""#, r#""7""#])
                .prop_map(String::from),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((name.clone(), inner), 0..5).prop_map(|kv| {
                    let body: Vec<String> = kv
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\": {v}"))
                        .collect();
                    format!("{{{}}}", body.join(", "))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn fast_reads_agree_with_the_value_tree(text in json_text()) {
            for paths in [&["a", "b"][..], &["a.b", "c"], &["a.a.a", "id", "b.c"], &["c.id"]] {
                agree(&text, paths);
            }
        }
    }
}
