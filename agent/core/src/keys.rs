//! The two keys the plan joins names into: a node pair (`a/b`, the key of a return link and its
//! claim) and a mapping (`namespace/name`). Each is built from its parts and keeps its rendered
//! text, so it prints, serialises and sorts exactly as the string it replaces (the JSON of
//! `kuport plan`, status texts and sorted outputs are unchanged), and no stage splits or joins
//! the text by hand.
//!
//! Both order by their text, not by their parts: `a-x/b` sorts before `a/b` as text (`-` is below
//! `/`) but after it as a pair of names, and the stored claims, the plan's maps and its sorted
//! lists have always followed the text.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Two distinct node names, sorted bytewise, rendered `a/b`. Neither name is empty or holds a
/// `/` (Kubernetes node names cannot), so the text splits back into the same two names.
#[derive(Clone, Debug)]
pub struct NodePair {
    /// `a/b`, shared by the pair's clones: a pair is named by every mapping that needs its
    /// link.
    text: Arc<str>,
    /// Where the `/` is.
    split: usize,
}

impl NodePair {
    /// The pair of `a` and `b`, in either order; `None` when they are equal, or either is empty
    /// or holds a `/`.
    pub fn new(a: &str, b: &str) -> Option<Self> {
        let usable = |n: &str| !n.is_empty() && !n.contains('/');
        if a == b || !usable(a) || !usable(b) {
            return None;
        }
        let (first, second) = if a < b { (a, b) } else { (b, a) };
        let mut text = String::with_capacity(first.len() + 1 + second.len());
        text.push_str(first);
        text.push('/');
        text.push_str(second);
        Some(Self {
            text: Arc::from(text),
            split: first.len(),
        })
    }

    /// Reads a stored key: two distinct non-empty names already in order, joined by one `/`.
    pub fn parse(key: &str) -> Option<Self> {
        let (a, b) = key.split_once('/')?;
        (a < b).then(|| Self::new(a, b)).flatten()
    }

    /// The two names, sorted.
    pub fn nodes(&self) -> (&str, &str) {
        (&self.text[..self.split], &self.text[self.split + 1..])
    }

    /// The other end as seen from `node`, when `node` is one of the two.
    pub fn other(&self, node: &str) -> Option<&str> {
        let (a, b) = self.nodes();
        if a == node {
            Some(b)
        } else if b == node {
            Some(a)
        } else {
            None
        }
    }

    /// `a/b`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A namespaced object's key, `namespace/name`: how the plan names a mapping in host facts, held
/// ports, refusals, nft comments and counters (and a Service in messages).
#[derive(Clone, Debug)]
pub struct MappingKey {
    /// `namespace/name`.
    text: String,
}

impl MappingKey {
    /// The key of `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> Self {
        let mut text = String::with_capacity(namespace.len() + 1 + name.len());
        text.push_str(namespace);
        text.push('/');
        text.push_str(name);
        Self { text }
    }

    /// True when `text` is the key of `name` in `namespace`; builds no key to say so.
    pub fn names(text: &str, namespace: &str, name: &str) -> bool {
        text.len() == namespace.len() + 1 + name.len()
            && text.starts_with(namespace)
            && text[namespace.len()..].starts_with('/')
            && text.ends_with(name)
    }

    /// `namespace/name`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// `namespace/name`, as an owned string.
    pub fn into_string(self) -> String {
        self.text
    }
}

/// Equality, order, hash, printing and serialisation by the rendered text alone.
macro_rules! text_key {
    ($key:ty) => {
        impl PartialEq for $key {
            fn eq(&self, other: &Self) -> bool {
                self.as_str() == other.as_str()
            }
        }

        impl Eq for $key {}

        impl PartialOrd for $key {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $key {
            fn cmp(&self, other: &Self) -> Ordering {
                self.as_str().cmp(other.as_str())
            }
        }

        impl Hash for $key {
            fn hash<H: Hasher>(&self, state: &mut H) {
                self.as_str().hash(state);
            }
        }

        impl fmt::Display for $key {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $key {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        // Sound because the key orders, compares and hashes by its text.
        impl Borrow<str> for $key {
            fn borrow(&self) -> &str {
                self.as_str()
            }
        }

        impl PartialEq<str> for $key {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $key {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl PartialEq<String> for $key {
            fn eq(&self, other: &String) -> bool {
                self.as_str() == *other
            }
        }
    };
}

text_key!(NodePair);
text_key!(MappingKey);
text_key!(Name);

/// A node, class or namespace name that many plan values hold: a class's name in each of its
/// thousands of mappings and links, a node's in every mapping it serves; and any other text
/// many values repeat, such as a mapping's counter name and comment in each of its rules.
/// Cloning one copies a pointer instead of the text (the plan pass allocated a string per copy). It compares, sorts,
/// hashes, prints and serialises exactly as the string it holds.
#[derive(Clone)]
pub struct Name {
    text: Arc<str>,
}

impl Name {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl From<&str> for Name {
    fn from(text: &str) -> Self {
        Self {
            text: Arc::from(text),
        }
    }
}

impl From<String> for Name {
    fn from(text: String) -> Self {
        Self {
            text: Arc::from(text),
        }
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn a_pair_sorts_its_nodes_and_splits_back() {
        let pair = NodePair::new("worker-b", "edge-a").expect("pair");
        assert_eq!(pair.to_string(), "edge-a/worker-b");
        assert_eq!(pair.nodes(), ("edge-a", "worker-b"));
        assert_eq!(NodePair::parse("edge-a/worker-b"), Some(pair.clone()));
        assert_eq!(pair.other("edge-a"), Some("worker-b"));
        assert_eq!(pair.other("worker-c"), None);
        assert_eq!(
            serde_json::to_value(&pair).expect("json"),
            "edge-a/worker-b"
        );
    }

    #[test]
    fn malformed_pairs_are_not_made() {
        assert_eq!(NodePair::new("a", "a"), None);
        assert_eq!(NodePair::new("", "a"), None);
        assert_eq!(NodePair::new("a/b", "c"), None);
        assert_eq!(NodePair::parse("worker-b/edge-a"), None, "unsorted");
        assert_eq!(NodePair::parse("a/a"), None);
        assert_eq!(NodePair::parse("a"), None);
        assert_eq!(NodePair::parse("a/b/c"), None);
        assert_eq!(NodePair::parse("/b"), None);
    }

    #[test]
    fn pairs_sort_as_their_text() {
        // As text `a-x/b` < `a/b` ('-' < '/'); as a tuple of names ("a", "b") comes first.
        let names = ["a", "a-x", "a.b", "b", "a0", "ab"];
        let mut pairs = Vec::new();
        for x in names {
            for y in names {
                pairs.extend(NodePair::new(x, y));
            }
        }
        let by_pair: Vec<String> = pairs
            .iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(ToString::to_string)
            .collect();
        let by_text: Vec<String> = pairs
            .iter()
            .map(ToString::to_string)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(by_pair, by_text);
        assert!(NodePair::new("a-x", "b") < NodePair::new("a", "b"));
    }

    #[test]
    fn a_name_behaves_as_its_text() {
        let names = ["b", "a-x", "a", "a/b", ""];
        let mut shared: Vec<Name> = names.iter().map(|n| Name::from(*n)).collect();
        shared.sort();
        let mut texts = names.to_vec();
        texts.sort();
        assert_eq!(shared.iter().map(Name::as_str).collect::<Vec<_>>(), texts);
        let name = Name::from("edge-a");
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"edge-a\"");
        assert_eq!(format!("{name} {name:?}"), "edge-a \"edge-a\"");
        let (text, owned) = ("edge-a", String::from("edge-a"));
        assert!(name == text);
        assert!(text == name);
        assert!(owned == name);
        // Found by its text in a table keyed by names (Borrow<str> hashes as the text).
        let table: std::collections::HashMap<Name, u8> = [(name.clone(), 1)].into();
        assert_eq!(table.get("edge-a"), Some(&1));
        // A clone shares the text rather than copying it.
        assert!(std::ptr::eq(name.as_str(), name.clone().as_str()));
    }

    #[test]
    fn a_mapping_key_is_its_parts_joined() {
        let key = MappingKey::new("games", "gs");
        assert_eq!(key.to_string(), "games/gs");
        assert_eq!(key, "games/gs");
        assert!(MappingKey::new("a-x", "b") < MappingKey::new("a", "b"));
        assert!(MappingKey::names("games/gs", "games", "gs"));
        assert!(!MappingKey::names("games/gs", "game", "s/gs"));
        assert!(!MappingKey::names("games/gs", "games", "g"));
        assert!(!MappingKey::names("gamesxgs", "games", "gs"));
    }
}
