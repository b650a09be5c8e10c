//! The JSONPath subset printer columns use (`.a.b`, `[*]`, `[N]`, `[?(@.a=="x")]`): parsed once
//! when the model is built, evaluated for every Table cell.

use serde_json::Value;

/// One step of a parsed JSONPath.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    All,
    Index(usize),
    /// `[?(@.a.b=="x")]`: the elements whose field equals the literal.
    Filter(Vec<String>, Value),
}

/// A JSONPath in the subset printer columns use.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonPath {
    steps: Vec<Step>,
}

fn parse_field(s: &str) -> Result<(String, &str), String> {
    let end = s.find(['.', '[']).unwrap_or(s.len());
    let name = &s[..end];
    if name.is_empty() {
        return Err("empty field name".to_owned());
    }
    Ok((name.to_owned(), &s[end..]))
}

impl JsonPath {
    /// Parses `.a.b[*].c`, `.a[0]`, `.a[?(@.type=="X")].b`, with or without surrounding braces.
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        let mut rest = trimmed
            .strip_prefix('{')
            .and_then(|s| s.strip_suffix('}'))
            .unwrap_or(trimmed);
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('.') {
                let (name, tail) = parse_field(after)?;
                steps.push(Step::Field(name));
                rest = tail;
            } else if let Some(after) = rest.strip_prefix('[') {
                let close = if after.starts_with("?(") {
                    after.find(")]").map(|i| i + 1)
                } else {
                    after.find(']')
                }
                .ok_or_else(|| format!("unclosed '[' in {text:?}"))?;
                let inner = &after[..close];
                rest = &after[close + 1..];
                if inner == "*" {
                    steps.push(Step::All);
                } else if let Ok(i) = inner.parse::<usize>() {
                    steps.push(Step::Index(i));
                } else if let Some(filter) =
                    inner.strip_prefix("?(@.").and_then(|s| s.strip_suffix(')'))
                {
                    let (lhs, rhs) = filter
                        .split_once("==")
                        .ok_or_else(|| format!("filter without == in {text:?}"))?;
                    let path = lhs.trim().split('.').map(str::to_owned).collect();
                    let rhs = rhs.trim();
                    let literal = if let Some(s) = rhs
                        .strip_prefix('"')
                        .and_then(|s| s.strip_suffix('"'))
                        .or_else(|| rhs.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
                    {
                        Value::String(s.to_owned())
                    } else {
                        serde_json::from_str(rhs)
                            .map_err(|_| format!("filter literal {rhs:?} in {text:?}"))?
                    };
                    steps.push(Step::Filter(path, literal));
                } else {
                    return Err(format!("unsupported bracket [{inner}] in {text:?}"));
                }
            } else {
                return Err(format!("expected '.' or '[' at {rest:?} in {text:?}"));
            }
        }
        Ok(Self { steps })
    }

    /// Every value the path selects, in document order.
    pub fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![root];
        for step in &self.steps {
            let mut next = Vec::new();
            for v in current {
                match step {
                    Step::Field(name) => next.extend(v.get(name.as_str())),
                    Step::All => match v {
                        Value::Array(items) => next.extend(items.iter()),
                        Value::Object(map) => next.extend(map.values()),
                        _ => {}
                    },
                    Step::Index(i) => next.extend(v.get(*i)),
                    Step::Filter(path, literal) => {
                        if let Value::Array(items) = v {
                            next.extend(items.iter().filter(|item| {
                                path.iter()
                                    .try_fold(*item, |node, key| node.get(key.as_str()))
                                    == Some(literal)
                            }));
                        }
                    }
                }
            }
            current = next;
        }
        current
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_select_fields_wildcards_indexes_and_filters() {
        let doc = json!({"status": {"conditions": [
            {"type": "Accepted", "status": "True"},
            {"type": "Programmed", "status": "False"}],
            "published": [{"address": "a"}, {"address": "b"}]}});
        let get = |p: &str| -> Vec<Value> {
            JsonPath::parse(p)
                .expect("parses")
                .find(&doc)
                .into_iter()
                .cloned()
                .collect()
        };
        assert_eq!(
            get(".status.conditions[?(@.type==\"Programmed\")].status"),
            [json!("False")]
        );
        assert_eq!(
            get(".status.published[*].address"),
            [json!("a"), json!("b")]
        );
        assert_eq!(get(".status.published[1].address"), [json!("b")]);
        assert_eq!(get(".status.missing.deeper"), Vec::<Value>::new());
        assert_eq!(get("{.status.published[0].address}"), [json!("a")]);
    }

    #[test]
    fn unsupported_paths_are_refused_with_the_reason() {
        for bad in [".a[", ".a[x]", "a.b", ".a[?(@.b)]", ".."] {
            assert!(JsonPath::parse(bad).is_err(), "{bad} should be refused");
        }
    }
}
