//! The message for a job file the parser refused: which field it is about, where that field
//! is, and what is wrong, in the words of the job spec.
//!
//! serde-saphyr's own location is right for a value it reads directly, but for anything read
//! through the flattened, internally tagged operator kind (`kind`, and every field of the
//! kind: `keys`, `rate`, `sizeMs`, ...) serde first buffers the whole operator, so the error
//! surfaces at the operator's last key, after the value it is about. The field is therefore
//! found in the document's tree ([`super::yaml_tree`]) by what the error names: the value of
//! an unknown variant, the key of an unknown field, the mapping that lacks a missing field, the
//! value of a bad number. The search starts in the innermost mapping holding the parser's
//! location and widens to its parents. Among several matches it prefers, for an unknown
//! variant, a field whose type takes exactly the variants the error lists (so `kind: windw`
//! wins over `name: windw`); then the last one whose key is at or before that location (the
//! error comes after what it is about), else the first.

use serde_saphyr::Error;

use super::yaml_tree::{Kind, Node, Place, Pos, Step};
use super::{COMMON_OPERATOR_FIELDS, OperatorKind, RateSpec};
use crate::nexmark::queries::{BidKey, SelectQuery};
use crate::time::window::WindowSpec;

/// The parser's message for any YAML file it refused, in one line: its first (`line L column
/// C: reason`; the rest is a source snippet) without its own `error: ` prefix, since the
/// caller's message already says it is one. Empty when the parser gave no text.
pub fn first_line(err: &Error) -> String {
    let full = err.to_string();
    let first = full.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// The message for the job file `text` that the parser refused with `err`, e.g.
/// `line 5 column 24: operators[2] (win).kind: unknown variant `windw`, expected one of ...`.
///
/// Falls back to the parser's first line (`line L column C: reason`) when the text is not
/// valid YAML or the field cannot be found.
pub(crate) fn explain(text: &str, err: &Error) -> String {
    let mut msg = first_line(err);
    // The parser's hint about its own options means nothing to a job file's author.
    if let Some(m) = msg.strip_suffix(", set DuplicateKeyPolicy in Options if acceptable") {
        msg = format!("{m} (each key may appear only once in a mapping)");
    }
    let problem = match err.location() {
        Some(l) => msg
            .strip_prefix(&format!("line {} column {}: ", l.line(), l.column()))
            .unwrap_or(&msg),
        None => &msg,
    };
    let (Some(loc), Some(root)) = (err.location(), Node::parse(text)) else {
        return msg;
    };
    match field_of(&root, (loc.line(), loc.column()), original(err), problem) {
        Some(Found { path, at, why }) if path.is_empty() => {
            format!("line {} column {}: {why}", at.0, at.1)
        }
        Some(Found { path, at, why }) => {
            format!(
                "line {} column {}: {}: {why}",
                at.0,
                at.1,
                root.render(&path)
            )
        }
        None => msg,
    }
}

/// The field an error is about, where it is, and the reason to give.
struct Found {
    /// The field (for an unknown or missing field: the mapping that has or lacks it).
    path: Vec<Step>,
    /// Where to point: the bad value, the unknown key, or the start of the mapping.
    at: Pos,
    /// The reason, after the field.
    why: String,
}

/// A place an error may be about.
#[derive(Clone)]
struct Hit {
    /// The field.
    path: Vec<Step>,
    /// Where to point.
    at: Pos,
    /// Where the parser was when it read the field: its key, for a mapping value.
    order: Pos,
    /// Whether the place fits what the error says better than others (e.g. the field's type
    /// takes exactly the variants the error lists).
    preferred: bool,
}

impl Hit {
    /// The value at `p`, ordered by its key.
    fn value(p: &Place<'_>) -> Hit {
        Hit {
            path: p.path.clone(),
            at: p.node.at,
            order: p.key.map_or(p.node.at, |k| k.at),
            preferred: false,
        }
    }

    /// The key of the value at `p`, about the mapping that holds it.
    fn key(p: &Place<'_>) -> Option<Hit> {
        let key = p.key?;
        Some(Hit {
            path: p.path[..p.path.len().checked_sub(1)?].to_vec(),
            at: key.at,
            order: key.at,
            preferred: false,
        })
    }
}

/// The error inside the parser's wrappers (source snippet, alias).
fn original(mut err: &Error) -> &Error {
    while let Error::WithSnippet { error, .. } | Error::AliasError { error, .. } = err {
        err = error;
    }
    err
}

/// The field the parser's error `err` (at `loc`, saying `problem`) is about, in the tree
/// `root`, with the reason to give; `None` when it cannot be found or the error names none.
fn field_of(root: &Node, loc: Pos, err: &Error, problem: &str) -> Option<Found> {
    let found = |Hit { path, at, .. }: Hit, why: String| Found { path, at, why };
    match err {
        // `kind: windw` (a value), or `rate: { constnt: 1 }` (the key of an externally tagged
        // enum, which is about the field holding it).
        Error::SerdeUnknownVariant {
            variant, expected, ..
        } => {
            let hit = nearest(root, loc, |p| {
                let mut hit = if p.key.is_some() && p.node.scalar() == Some(variant.as_str()) {
                    Hit::value(p)
                } else if p.key?.scalar() == Some(variant.as_str()) && p.path.len() >= 2 {
                    Hit::key(p)?
                } else {
                    return None;
                };
                hit.preferred = match hit.path.last() {
                    Some(Step::Key(field)) => choices(field).as_ref() == Some(expected),
                    _ => false,
                };
                Some(hit)
            })?;
            Some(found(hit, problem.to_string()))
        }
        Error::SerdeUnknownField { field, .. } => {
            let hit = nearest(root, loc, |p| {
                (p.key?.scalar() == Some(field.as_str())).then(|| Hit::key(p))?
            })?;
            let mut why = problem.to_string();
            if is_operator(&hit.path) {
                why.push_str(&format!(
                    "; every operator also takes {}",
                    COMMON_OPERATOR_FIELDS.join(", ")
                ));
            }
            Some(found(hit, why))
        }
        Error::SerdeMissingField { field, .. } => {
            let (path, map) = lacking(root, loc, field)?;
            let why = format!("missing field `{field}`{}", needs(map, field));
            Some(Found {
                path,
                at: map.at,
                why,
            })
        }
        Error::SerdeInvalidValue {
            unexpected,
            expected,
            ..
        }
        | Error::SerdeInvalidType {
            unexpected,
            expected,
            ..
        } if expected == "map with a single key" => {
            // An externally tagged enum (`rate`, `window`) given several keys or none.
            let hit = nearest(root, loc, |p| {
                (p.key.is_some()
                    && matches!(p.node.kind, Kind::Map(_))
                    && p.node.entries().len() != 1)
                    .then(|| Hit::value(p))
            });
            let Some(Hit { path, at, .. }) = hit else {
                return Some(Found {
                    path: Vec::new(),
                    at: loc,
                    why: format!("invalid value: {unexpected}, expected {expected}"),
                });
            };
            let keys = root.at_path(&path).map(Node::keys).unwrap_or_default();
            let field = last_key(&path);
            let one_of = choices(field).map_or_else(
                || "one key".to_string(),
                |c| format!("exactly one of {}", c.join(", ")),
            );
            let found_keys = match keys.as_slice() {
                [] => "none".to_string(),
                [init @ .., last] if !init.is_empty() => {
                    format!("{} and {last}", init.join(", "))
                }
                keys => keys.join(", "),
            };
            Some(Found {
                path,
                at,
                why: format!("give {one_of} (found {found_keys})"),
            })
        }
        Error::SerdeInvalidValue {
            unexpected,
            expected,
            ..
        }
        | Error::SerdeInvalidType {
            unexpected,
            expected,
            ..
        } => {
            let hit = nearest(root, loc, |p| {
                (p.key.is_some() && is_unexpected(p.node, unexpected)).then(|| Hit::value(p))
            })?;
            let value = root.at_path(&hit.path).map(shown).unwrap_or_default();
            let field = last_key(&hit.path);
            let why = match (expected.as_str(), choices(field)) {
                // An externally tagged enum (`rate: 5`).
                ("string or map", Some(c)) => format!(
                    "expected a mapping with one of {} (e.g. `{field}: {{ {}: ... }}`), got {unexpected}",
                    c.join(", "),
                    c[0]
                ),
                _ => number_expected(expected, &value).unwrap_or_else(|| problem.to_string()),
            };
            Some(found(hit, why))
        }
        // A value the parser read directly: its location is the value's.
        Error::InvalidScalar { ty, .. } => {
            let hit = value_at(root, loc)?;
            let value = root.at_path(&hit.path).map(shown).unwrap_or_default();
            let why = number_expected(ty, &value).unwrap_or_else(|| problem.to_string());
            Some(found(hit, why))
        }
        Error::NonFiniteFloat { value, .. } => {
            let hit = value_at(root, loc).or_else(|| {
                nearest(root, loc, |p| {
                    (p.key.is_some() && p.node.raw == *value).then(|| Hit::value(p))
                })
            })?;
            Some(found(
                hit,
                format!("{value} is not allowed, it must be a finite number"),
            ))
        }
        // Anything else the parser located at a value (`edges: { ... }`: "expected sequence
        // start"): name that value's field.
        _ => {
            let p = root
                .places()
                .into_iter()
                .find(|p| !p.path.is_empty() && p.node.at == loc)?;
            Some(found(Hit::value(&p), problem.to_string()))
        }
    }
}

/// Among the places `pick` accepts, the one the error at `loc` is about: searched below the
/// innermost collection holding `loc`, then below each of its parents in turn. Of several
/// matches at one level: the preferred ones if any; of those, the last the parser had read by
/// `loc` (by key position), else the first.
fn nearest<'a>(root: &'a Node, loc: Pos, pick: impl Fn(&Place<'a>) -> Option<Hit>) -> Option<Hit> {
    let places = root.places();
    let scope = root.innermost_at(loc);
    (0..=scope.len()).rev().find_map(|depth| {
        let mut hits: Vec<Hit> = places
            .iter()
            .filter(|p| p.path.len() > depth && p.path.starts_with(&scope[..depth]))
            .filter_map(&pick)
            .collect();
        if hits.iter().any(|h| h.preferred) {
            hits.retain(|h| h.preferred);
        }
        let before = hits.iter().rfind(|h| h.order <= loc);
        before.or(hits.first()).cloned()
    })
}

/// The scalar mapping value or sequence item that starts exactly at `loc`.
fn value_at(root: &Node, loc: Pos) -> Option<Hit> {
    root.places()
        .into_iter()
        .find(|p| !p.path.is_empty() && p.node.at == loc && p.node.scalar().is_some())
        .map(|p| Hit::value(&p))
}

/// The innermost mapping holding `loc` that lacks `field`, with its path.
fn lacking<'a>(root: &'a Node, loc: Pos, field: &str) -> Option<(Vec<Step>, &'a Node)> {
    let scope = root.innermost_at(loc);
    (0..=scope.len()).rev().find_map(|depth| {
        let path = &scope[..depth];
        let node = root.at_path(path)?;
        (matches!(node.kind, Kind::Map(_)) && node.get(field).is_none())
            .then(|| (path.to_vec(), node))
    })
}

/// Whether `path` is an operator's: `operators[i]`.
fn is_operator(path: &[Step]) -> bool {
    matches!(path, [Step::Key(k), Step::Index(_)] if k == "operators")
}

/// Whether `node` is the value serde describes as `unexpected` (`integer `-5``, `floating
/// point `1.5``, `string "ten"`, `map`, `sequence`).
fn is_unexpected(node: &Node, unexpected: &str) -> bool {
    match (&node.kind, unexpected) {
        (Kind::Map(_), "map") | (Kind::Seq(_), "sequence") => true,
        (Kind::Scalar(s), "unit value" | "null") => s.is_empty(),
        (Kind::Scalar(s), _) => {
            let Some(payload) = quoted(unexpected) else {
                return false;
            };
            s == payload
                || node.raw.trim_matches(['"', '\'']) == payload
                || matches!(
                    (s.parse::<f64>(), payload.parse::<f64>()),
                    (Ok(a), Ok(b)) if a == b
                )
        }
        _ => false,
    }
}

/// The text between the first pair of backticks or double quotes.
fn quoted(s: &str) -> Option<&str> {
    let start = s.find(['`', '"'])?;
    let q = s[start..].chars().next()?;
    let rest = &s[start + 1..];
    Some(&rest[..rest.find(q)?])
}

/// A scalar as shown in a message: as written, without quotes.
fn shown(node: &Node) -> String {
    node.raw.trim_matches(['"', '\'']).to_string()
}

/// The reason for a value that is not the number a field takes, when `ty` (a Rust type
/// name as serde names it: `u32`, `f64`) is a number type.
fn number_expected(ty: &str, value: &str) -> Option<String> {
    match ty {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => {
            Some(format!("expected a whole number >= 0, got \"{value}\""))
        }
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => {
            Some(format!("expected a whole number, got \"{value}\""))
        }
        "f32" | "f64" | "floating point" => Some(format!("expected a number, got \"{value}\"")),
        _ => None,
    }
}

/// What to add to "missing field `field`" of the mapping `map`: the operator kind that needs
/// it and the choices it takes, e.g. ` (a source needs `rate`: one of constant, steps, trace)`.
fn needs(map: &Node, field: &str) -> String {
    let kind = map
        .get("kind")
        .and_then(Node::scalar)
        .filter(|_| !COMMON_OPERATOR_FIELDS.contains(&field));
    match (kind, choices(field)) {
        (Some(kind), Some(c)) => format!(" (a {kind} needs `{field}`: one of {})", c.join(", ")),
        (Some(kind), None) => format!(" (a {kind} needs `{field}`)"),
        (None, Some(c)) => format!(" (one of {})", c.join(", ")),
        (None, None) => String::new(),
    }
}

/// The variants a field of an enum type takes (`rate`: constant, steps, trace), read from the
/// types themselves by asking serde for an empty variant.
fn choices(field: &str) -> Option<Vec<&'static str>> {
    fn variants<T: serde::de::DeserializeOwned>(yaml: &str) -> Option<Vec<&'static str>> {
        let e = serde_saphyr::from_str::<T>(yaml).err()?;
        match original(&e) {
            Error::SerdeUnknownVariant { expected, .. } => Some(expected.clone()),
            _ => None,
        }
    }
    match field {
        "rate" => variants::<RateSpec>("'': 0"),
        "window" => variants::<WindowSpec>("'': {}"),
        "kind" => variants::<OperatorKind>("kind: ''"),
        "query" => variants::<SelectQuery>("''"),
        "key" => variants::<BidKey>("''"),
        _ => None,
    }
}

/// The name of the field `path` ends at (its last key), empty when it ends at a list item.
fn last_key(path: &[Step]) -> &str {
    match path.last() {
        Some(Step::Key(k)) => k.as_str(),
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_come_from_the_types() {
        assert_eq!(choices("rate"), Some(vec!["constant", "steps", "trace"]));
        let kinds = choices("kind").unwrap();
        assert!(
            kinds.contains(&"window") && kinds.contains(&"source"),
            "{kinds:?}"
        );
        assert!(choices("window").unwrap().contains(&"tumbling"));
        assert_eq!(choices("cpu"), None);
    }

    #[test]
    fn quoted_payloads() {
        assert_eq!(quoted("integer `-5`"), Some("-5"));
        assert_eq!(quoted("string \"ten\""), Some("ten"));
        assert_eq!(quoted("map"), None);
    }
}
