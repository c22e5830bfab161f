//! The common case of [`FieldPaths::read`](super::FieldPaths::read) without `serde`: an
//! ASCII JSON object whose strings have no escapes, whose numbers are integers in the range
//! of `i64` or `u64` (and not `-0`), nested less than [`MAX_DEPTH`] deep, and whose paths
//! end at a string, an integer, `true`, `false` or `null`. Anything else, valid or not, is
//! left to the general reader ([`read`] answers `None`), which then gives the answer or the
//! error; on the inputs it accepts this reader gives the general reader's answer.

use std::borrow::Cow;

use serde_json::Number;

use super::{Leaf, bits};

/// Deepest nesting (objects and arrays) read here.
pub(super) const MAX_DEPTH: usize = 32;

/// Reads `bytes` as [`FieldPaths::read`](super::FieldPaths::read) does into `out` (one
/// slot per path), or answers `None` (with `out` in any state) when the input is not of the
/// common case, valid or not.
pub(super) fn read<'de>(
    paths: &[Vec<String>],
    bytes: &'de [u8],
    out: &mut [Option<Leaf<'de>>],
) -> Option<()> {
    let mut s = Scan { b: bytes, i: 0 };
    s.ws();
    s.eat(b'{')?;
    s.object(paths, 0, super::all_bits(paths.len()), out)?;
    s.ws();
    (s.i == bytes.len()).then_some(())
}

/// Whether names `a` and `b` are equal (the first bytes compared inline: most names differ
/// there).
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.first() == b.first() && a == b
}

/// A position in the input.
struct Scan<'de> {
    b: &'de [u8],
    i: usize,
}

impl<'de> Scan<'de> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Skips JSON whitespace.
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Consumes `c`, which must come next.
    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// Consumes `word` (after its first byte, which the caller saw).
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string's bytes after its opening quote, up to the closing one (consumed): printable
    /// ASCII without escapes only.
    #[inline]
    fn string(&mut self) -> Option<&'de [u8]> {
        let rest = self.b.get(self.i..)?;
        let n = rest
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c))?;
        if rest[n] != b'"' {
            return None;
        }
        self.i += n + 1;
        Some(&rest[..n])
    }

    /// An integer as `serde_json` reads it: a `u64` when not negative, an `i64` when
    /// negative; `None` for a fraction, an exponent, `-0` and values out of both ranges
    /// (`serde_json` reads those as floats), and for anything that is not a number.
    fn integer(&mut self) -> Option<Number> {
        let negative = self.peek()? == b'-';
        if negative {
            self.i += 1;
        }
        let mut magnitude: u64 = match self.peek()? {
            b'0' => {
                self.i += 1;
                0
            }
            d @ b'1'..=b'9' => {
                self.i += 1;
                let mut m = u64::from(d - b'0');
                while let Some(d @ b'0'..=b'9') = self.peek() {
                    m = m.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
                    self.i += 1;
                }
                m
            }
            _ => return None,
        };
        if let Some(b'0'..=b'9' | b'.' | b'e' | b'E') = self.peek() {
            return None;
        }
        if !negative {
            return Some(Number::from(magnitude));
        }
        if magnitude == 0 || magnitude > 1 << 63 {
            return None;
        }
        magnitude = magnitude.wrapping_neg();
        Some(Number::from(magnitude as i64))
    }

    /// The value at the end of a path (`None` inside: `null`); composites are left to the
    /// general reader.
    fn leaf(&mut self) -> Option<Option<Leaf<'de>>> {
        Some(match self.peek()? {
            b'"' => {
                self.i += 1;
                let s = std::str::from_utf8(self.string()?).ok()?;
                Some(Leaf::Str(Cow::Borrowed(s)))
            }
            b't' => {
                self.literal(b"true")?;
                Some(Leaf::Bool(true))
            }
            b'f' => {
                self.literal(b"false")?;
                Some(Leaf::Bool(false))
            }
            b'n' => {
                self.literal(b"null")?;
                None
            }
            _ => Some(Leaf::Number(self.integer()?)),
        })
    }

    /// Reads and drops one value `depth` levels down.
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.i += 1;
                self.string().map(drop)
            }
            b'{' => {
                self.i += 1;
                self.object(&[], depth + 1, 0, &mut [])
            }
            b'[' => {
                if depth + 1 >= MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.ws();
                    self.skip(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.integer().map(drop),
        }
    }

    /// The members of an object (after its `{`) `depth` levels down, on the way to the
    /// paths in `active` (bit i: path i, whose first `depth` names led here). A repeated
    /// name's last value counts, as in a `serde_json::Value`.
    fn object(
        &mut self,
        paths: &[Vec<String>],
        depth: usize,
        active: u64,
        out: &mut [Option<Leaf<'de>>],
    ) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            self.eat(b'"')?;
            let name = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let sub = bits(active)
                .filter(|&i| same(paths[i][depth].as_bytes(), name))
                .fold(0u64, |m, i| m | (1 << i));
            if sub == 0 {
                self.skip(depth)?;
            } else {
                // Paths neither repeat nor start one another: a path ending here is alone.
                let first = sub.trailing_zeros() as usize;
                if paths[first].len() == depth + 1 {
                    out[first] = self.leaf()?;
                } else {
                    bits(sub).for_each(|i| out[i] = None);
                    if self.peek()? == b'{' {
                        self.i += 1;
                        self.object(paths, depth + 1, sub, out)?;
                    } else {
                        self.skip(depth)?;
                    }
                }
            }
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::FieldPaths;
    use super::*;
    use crate::json_field::{lookup, parse_object};
    use proptest::prelude::*;
    use serde_json::Value;

    /// This reader's answer for dotted `paths` (`None`: left to the general reader).
    fn plain(text: &str, paths: &[&str]) -> Option<Vec<Option<Value>>> {
        let fp = FieldPaths::dotted(paths).expect("valid paths");
        let mut out = vec![None; paths.len()];
        read(&fp.paths, text.as_bytes(), &mut out)?;
        Some(out.iter().map(|o| o.as_ref().map(Leaf::to_value)).collect())
    }

    /// The `Value` tree's answer (`None`: not a JSON object).
    fn tree(text: &str, paths: &[&str]) -> Option<Vec<Option<Value>>> {
        let v = parse_object(Some(text.as_bytes())).ok()?;
        Some(paths.iter().map(|p| lookup(&v, p).cloned()).collect())
    }

    #[test]
    fn common_inputs_are_read_here_as_the_value_tree_reads_them() {
        let paths = ["key", "value", "user.id"];
        for text in [
            r#"{"seq":123456,"key":"k17","value":56,"ts":1733390000000}"#,
            r#"{"key": "k1", "value": -42, "user": {"id": "ann", "n": [1, {"x": null}]}}"#,
            "\t{ \"value\" :\r\n 18446744073709551615 , \"key\":\"\" }\n",
            r#"{"value": -9223372036854775808, "key": 7, "user": {"id": 0}}"#,
            r#"{"value": 1, "value": 2, "key": "a", "key": null}"#,
            r#"{"user": {"id": "a"}, "user": 3, "key": true, "value": false}"#,
            r#"{"user": {"id": "a"}, "user": {"x": "y"}}"#,
            r#"{"user": "id", "other": [[], {}, [true, false, null, "s", -3]]}"#,
            r#"{}"#,
        ] {
            let got = plain(text, &paths);
            assert!(got.is_some(), "left to the general reader: {text}");
            assert_eq!(got, tree(text, &paths), "{text}");
        }
    }

    #[test]
    fn other_inputs_are_left_to_the_general_reader() {
        let paths = ["key", "value"];
        for text in [
            // Valid, outside the common case.
            r#"{"key": "a\"b", "value": 1}"#,
            r#"{"k\u0065y": "a", "value": 1}"#,
            r#"{"key": "é", "value": 1}"#,
            r#"{"key": "a", "value": 1.5}"#,
            r#"{"key": "a", "value": 1e3}"#,
            r#"{"key": "a", "value": -0}"#,
            r#"{"key": "a", "value": 18446744073709551616}"#,
            r#"{"key": "a", "value": -9223372036854775809}"#,
            r#"{"key": {"a": 1}, "value": 1}"#,
            r#"{"key": [1], "value": 1}"#,
            r#"{"other": 2.5, "value": 1}"#,
            // Not JSON objects.
            "",
            "[1]",
            "7",
            r#"{"value": 1} x"#,
            r#"{"value": 1}{"value": 2}"#,
            r#"{"value": 1,}"#,
            r#"{"value": 01}"#,
            r#"{"value": -}"#,
            r#"{"value": tru}"#,
            r#"{"value": [1, 2}"#,
            r#"{"value" 1}"#,
            r#"{value: 1}"#,
            "{\"key\": \"a\u{1}b\"}",
            r#"{"key": "open"#,
        ] {
            assert_eq!(plain(text, &paths), None, "{text}");
        }
        let deep = format!("{{\"x\": {}{}}}", "[".repeat(40), "]".repeat(40));
        assert_eq!(plain(&deep, &paths), None);
        let deep = format!("{{\"x\": {}1{}}}", "{\"a\":".repeat(40), "}".repeat(40));
        assert_eq!(plain(&deep, &paths), None);
        let shallow = format!("{{\"x\": {}{}}}", "[".repeat(20), "]".repeat(20));
        assert_eq!(plain(&shallow, &paths), Some(vec![None, None]));
    }

    /// JSON objects of the common case: ASCII names, integers, strings without escapes,
    /// nesting, repeated names, varied whitespace; a member named `id` holds no object or
    /// array.
    fn plain_text() -> impl Strategy<Value = String> {
        let name = prop::sample::select(vec!["a", "b", "c", ""]);
        let ws = prop::sample::select(vec!["", " ", "\n\t", "\r "]);
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            "[ -~&&[^\"\\\\]]{0,6}".prop_map(|s| format!("\"{s}\"")),
        ];
        let member = move |value: BoxedStrategy<String>| {
            prop_oneof![
                (name.clone(), value, ws.clone()),
                (Just("id"), leaf.clone(), ws.clone()),
            ]
            .prop_map(|(k, v, w)| format!("{w}\"{k}\"{w}:{w}{v}{w}"))
        };
        let object = move |value: BoxedStrategy<String>| {
            prop::collection::vec(member(value), 0..5).prop_map(|m| format!("{{{}}}", m.join(",")))
        };
        let inner = object.clone();
        let value = leaf_of_plain().prop_recursive(3, 24, 4, move |inner_value| {
            prop_oneof![
                prop::collection::vec(inner_value.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                inner(inner_value),
            ]
        });
        object(value.boxed())
    }

    fn leaf_of_plain() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("null".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            "[ -~&&[^\"\\\\]]{0,6}".prop_map(|s| format!("\"{s}\"")),
        ]
    }

    /// Paths ending at `id` (never an object or array in [`plain_text`]).
    const ID_PATHS: [&[&str]; 3] = [&["id"], &["a.id", "b.id"], &["a.b.id", "c.id", "id"]];
    const PATHS: [&[&str]; 4] = [
        &["a", "b"],
        &["a.b", "c"],
        &["a.a.a", "id", "b.c"],
        &["c.id"],
    ];

    proptest! {
        #[test]
        fn common_objects_are_read_here_as_the_value_tree_reads_them(text in plain_text()) {
            for paths in ID_PATHS {
                let got = plain(&text, paths);
                prop_assert!(got.is_some(), "left to the general reader: {}", text);
                prop_assert_eq!(got, tree(&text, paths), "{}", text);
            }
            for paths in PATHS {
                if let Some(got) = plain(&text, paths) {
                    prop_assert_eq!(Some(got), tree(&text, paths), "{}", text);
                }
            }
        }

        #[test]
        fn whatever_is_read_here_agrees_with_the_value_tree(
            text in "[{}\\[\\]\":, a-c0-9.eE\\-\\\\tfrulnsé]{0,40}"
        ) {
            for paths in PATHS {
                if let Some(got) = plain(&text, paths) {
                    prop_assert_eq!(Some(got), tree(&text, paths), "{}", text);
                }
            }
        }
    }
}
