//! A YAML document as a tree of nodes that remember where they are in the text, so that an
//! error can name the field it is about (`operators[2] (win).kind`) and its line and column.
//!
//! The tree is read by the same parser as the job spec (serde-saphyr, through its
//! [`serde_saphyr::Spanned`] positions), so its lines and columns are the parser's: 1-based,
//! columns counted in characters.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, NonFiniteFloatPolicy, Spanned};

/// A position in the text: 1-based (line, column), the column counted in characters.
pub(crate) type Pos = (u64, u64);

/// One node of the document.
#[derive(Debug)]
pub(crate) struct Node {
    /// Where the node starts (for a flow mapping its `{`, for a block mapping its first key).
    pub at: Pos,
    /// Where its last character (or its last descendant's) ends, exclusive.
    pub end: Pos,
    /// The scalar as written in the text (quotes included), empty for collections.
    pub raw: String,
    /// Its content.
    pub kind: Kind,
}

/// The content of a node.
#[derive(Debug)]
pub(crate) enum Kind {
    /// A scalar as the parser resolved it (`-5`, `1.5`, `ten`; non-finite floats as `.inf`,
    /// `-.inf`, `.nan`; null as the empty string).
    Scalar(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping's entries, key then value, in the order written.
    Map(Vec<(Node, Node)>),
}

/// One step of a path from the document's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// A node with the path that leads to it and, for a mapping value, its key.
#[derive(Debug)]
pub(crate) struct Place<'a> {
    /// Steps from the root to the node.
    pub path: Vec<Step>,
    /// The key of the entry whose value the node is (`None` for the root and sequence items).
    pub key: Option<&'a Node>,
    /// The node.
    pub node: &'a Node,
}

impl Node {
    /// Reads `text` as a tree; `None` when it is not valid YAML (the caller then has only the
    /// parser's own message).
    pub fn parse(text: &str) -> Option<Node> {
        // Keep non-finite floats (`.nan`, `1e999`) as scalars instead of refusing them: the
        // error being explained may well be about one.
        let options = serde_saphyr::options! {
            non_finite_float_policy: NonFiniteFloatPolicy::AsString,
        };
        let tree: Spanned<Tree> = serde_saphyr::from_str_with_options(text, options).ok()?;
        Some(Node::from_spanned(tree, text))
    }

    fn from_spanned(tree: Spanned<Tree>, text: &str) -> Node {
        let at = pos(&tree.referenced);
        let (raw, kind, end) = match tree.value {
            Tree::Scalar(s) => {
                let span = tree.referenced.span();
                let raw = match (span.byte_offset(), span.byte_len()) {
                    (Some(from), Some(len)) => usize::try_from(from)
                        .ok()
                        .zip(usize::try_from(from + len).ok())
                        .and_then(|(from, to)| text.get(from..to))
                        .unwrap_or(&s)
                        .to_string(),
                    _ => s.clone(),
                };
                let end = (at.0, at.1 + span.len());
                (raw, Kind::Scalar(s), end)
            }
            Tree::Seq(items) => {
                let items: Vec<Node> = items
                    .into_iter()
                    .map(|i| Node::from_spanned(i, text))
                    .collect();
                let end = items.iter().map(|n| n.end).fold(at, Ord::max);
                (String::new(), Kind::Seq(items), end)
            }
            Tree::Map(entries) => {
                let entries: Vec<(Node, Node)> = entries
                    .into_iter()
                    .map(|(k, v)| (Node::from_spanned(k, text), Node::from_spanned(v, text)))
                    .collect();
                let end = entries
                    .iter()
                    .map(|(k, v)| k.end.max(v.end))
                    .fold(at, Ord::max);
                (String::new(), Kind::Map(entries), end)
            }
        };
        Node { at, end, raw, kind }
    }

    /// The scalar's resolved text, if the node is a scalar.
    pub fn scalar(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// The mapping's entries (empty when the node is not a mapping).
    pub fn entries(&self) -> &[(Node, Node)] {
        match &self.kind {
            Kind::Map(entries) => entries,
            _ => &[],
        }
    }

    /// The mapping's keys, as written (scalar keys only).
    pub fn keys(&self) -> Vec<&str> {
        self.entries()
            .iter()
            .filter_map(|(k, _)| k.scalar())
            .collect()
    }

    /// The value under `key`, if the node is a mapping holding it.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entries()
            .iter()
            .find(|(k, _)| k.scalar() == Some(key))
            .map(|(_, v)| v)
    }

    /// The node at `path`.
    pub fn at_path(&self, path: &[Step]) -> Option<&Node> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        let next = match (first, &self.kind) {
            (Step::Key(k), Kind::Map(_)) => self.get(k)?,
            (Step::Index(i), Kind::Seq(items)) => items.get(*i)?,
            _ => return None,
        };
        next.at_path(rest)
    }

    /// Whether `p` lies within the node's text.
    pub fn contains(&self, p: Pos) -> bool {
        self.at <= p && p <= self.end
    }

    /// Every node of the tree with its path, parents before children, in text order.
    pub fn places(&self) -> Vec<Place<'_>> {
        let mut out = Vec::new();
        self.collect(Vec::new(), None, &mut out);
        out
    }

    fn collect<'a>(&'a self, path: Vec<Step>, key: Option<&'a Node>, out: &mut Vec<Place<'a>>) {
        out.push(Place {
            path: path.clone(),
            key,
            node: self,
        });
        match &self.kind {
            Kind::Scalar(_) => {}
            Kind::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    let mut p = path.clone();
                    p.push(Step::Index(i));
                    item.collect(p, None, out);
                }
            }
            Kind::Map(entries) => {
                for (k, v) in entries {
                    let mut p = path.clone();
                    p.push(Step::Key(k.scalar().unwrap_or(&k.raw).to_string()));
                    v.collect(p, Some(k), out);
                }
            }
        }
    }

    /// The path of the innermost collection (mapping or sequence) whose text holds `p`; the
    /// root's (empty) path when none does.
    pub fn innermost_at(&self, p: Pos) -> Vec<Step> {
        self.places()
            .into_iter()
            .filter(|pl| !matches!(pl.node.kind, Kind::Scalar(_)) && pl.node.contains(p))
            .map(|pl| pl.path)
            .max_by_key(Vec::len)
            .unwrap_or_default()
    }

    /// `path` as a user reads it: `operators[2] (win).kind`, `autoscaler.limits.onLimit`,
    /// `edges[0]`. A sequence item that is a mapping with a scalar `name` is followed by the
    /// name in parentheses.
    pub fn render(&self, path: &[Step]) -> String {
        let mut out = String::new();
        let mut node = Some(self);
        for step in path {
            match step {
                Step::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                    node = node.and_then(|n| n.get(k));
                }
                Step::Index(i) => {
                    out.push_str(&format!("[{i}]"));
                    node = node.and_then(|n| match &n.kind {
                        Kind::Seq(items) => items.get(*i),
                        _ => None,
                    });
                    if let Some(name) = node.and_then(|n| n.get("name")).and_then(Node::scalar) {
                        out.push_str(&format!(" ({name})"));
                    }
                }
            }
        }
        out
    }
}

fn pos(l: &Location) -> Pos {
    (l.line(), l.column())
}

/// Any YAML node with positions, as serde-saphyr hands it over.
enum Tree {
    Scalar(String),
    Seq(Vec<Spanned<Tree>>),
    Map(Vec<(Spanned<Tree>, Spanned<Tree>)>),
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Scalar(v.to_string()))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Scalar(v.to_string()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Scalar(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Scalar(v.to_string()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Tree, E> {
        Ok(Tree::Scalar(v.to_string()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Tree, E> {
        Ok(Tree::Scalar(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Tree, E> {
        Ok(Tree::Scalar(v.to_string()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Scalar(String::new()))
    }
    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Scalar(String::new()))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = a.next_element()? {
            items.push(item);
        }
        Ok(Tree::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = a.next_entry()? {
            entries.push(entry);
        }
        Ok(Tree::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOW: &str = "name: j\noperators:\n  - { name: src, kind: source, keys: -5, rate: { constant: 1e999 } }\n  - name: m\n    kind: map\n    cpu: 1.50\n";

    #[test]
    fn positions_raw_text_and_paths() {
        let root = Node::parse(FLOW).unwrap();
        let keys = root.at_path(&[
            Step::Key("operators".into()),
            Step::Index(0),
            Step::Key("keys".into()),
        ]);
        let keys = keys.unwrap();
        assert_eq!((keys.at, keys.scalar()), ((3, 38), Some("-5")));
        let rate = root
            .at_path(&[
                Step::Key("operators".into()),
                Step::Index(0),
                Step::Key("rate".into()),
                Step::Key("constant".into()),
            ])
            .unwrap();
        assert_eq!((rate.raw.as_str(), rate.scalar()), ("1e999", Some(".inf")));
        let cpu = root.places().into_iter().find(|p| p.node.raw == "1.50");
        let cpu = cpu.unwrap();
        assert_eq!(root.render(&cpu.path), "operators[1] (m).cpu");
        assert_eq!(cpu.key.map(|k| k.at), Some((6, 5)));
    }

    #[test]
    fn innermost_collection_holding_a_position() {
        let root = Node::parse(FLOW).unwrap();
        let at = |p| root.render(&root.innermost_at(p));
        assert_eq!(at((3, 32)), "operators[0] (src)");
        assert_eq!(at((3, 62)), "operators[0] (src).rate");
        assert_eq!(at((5, 5)), "operators[1] (m)");
        assert_eq!(at((1, 1)), "");
    }

    #[test]
    fn invalid_yaml_gives_no_tree() {
        assert!(Node::parse("a: [1, 2\n").is_none());
    }
}
