//! Server-side printing: `meta.k8s.io/v1` `Table` responses built from printer columns, with the
//! JSONPath subset the columns use (`.a.b`, `[*]`, `[N]`, `[?(@.a=="x")]`).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::resources::Resource;

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

/// A printer column.
#[derive(Clone, Debug)]
pub struct Column {
    /// Header (kubectl upper-cases it).
    pub name: String,
    /// OpenAPI type: string, integer, number, boolean, date.
    pub type_: String,
    /// OpenAPI format, if any.
    pub format: String,
    /// Description (`kubectl explain`-like help for the column).
    pub description: String,
    /// 0 shows always; higher only with `-o wide`.
    pub priority: i32,
    /// What the cell shows.
    pub path: JsonPath,
}

/// Renders a duration the way kubectl and the API server do (`HumanDuration`): `45s`, `5m3s`,
/// `3h`, `2d4h`, `400d`, `3y20d`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    let s = seconds.max(0);
    let minutes = s / 60;
    let hours = s / 3600;
    if s < 120 {
        format!("{s}s")
    } else if minutes < 10 {
        if s % 60 == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{}s", s % 60)
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        if minutes % 60 == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{}m", minutes % 60)
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        if hours % 24 == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{}h", hours / 24, hours % 24)
        }
    } else if hours < 24 * 365 * 2 {
        format!("{}d", hours / 24)
    } else if hours < 24 * 365 * 8 {
        let days = hours / 24;
        if days % 365 == 0 {
            format!("{}y", days / 365)
        } else {
            format!("{}y{}d", days / 365, days % 365)
        }
    } else {
        format!("{}y", hours / 24 / 365)
    }
}

/// One cell, as the real server's CRD table convertor renders it: only the *first* value the
/// path selects is shown (so a `[*]` column shows its first element), strings are printed,
/// integers and numbers stay numbers, dates become ages, and nothing selected is `null`.
fn cell(column: &Column, object: &Value, now: Timestamp) -> Value {
    let Some(value) = column.path.find(object).into_iter().next() else {
        return Value::Null;
    };
    match (column.type_.as_str(), value) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(s)) => Value::String(s.clone()),
        ("string", other) => Value::String(other.to_string()),
        ("integer", Value::Number(n)) => n
            .as_i64()
            .map(Value::from)
            .or_else(|| n.as_f64().map(|f| Value::from(f as i64)))
            .unwrap_or(Value::Null),
        ("number", Value::Number(n)) => n.as_f64().map(Value::from).unwrap_or(Value::Null),
        ("boolean", Value::Bool(b)) => Value::Bool(*b),
        ("date", Value::String(s)) => match s.parse::<Timestamp>() {
            Ok(t) => Value::String(human_duration(now.as_second() - t.as_second())),
            Err(_) => Value::String("<invalid>".to_owned()),
        },
        _ => Value::Null,
    }
}

/// Which object each row carries (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the query parameter; unknown values fall back to the default as the server does.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// A `Table` of `objects` with the resource's columns after `Name`.
pub fn to_table(
    resource: &Resource,
    objects: &[&Value],
    list_meta: Value,
    include: IncludeObject,
    now: Timestamp,
) -> Value {
    let mut definitions = vec![json!({
        "name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated.",
        "priority": 0,
    })];
    for c in &resource.columns {
        definitions.push(json!({
            "name": c.name, "type": c.type_, "format": c.format,
            "description": c.description, "priority": c.priority,
        }));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(resource.columns.iter().map(|c| cell(c, object, now)));
            let mut row = json!({"cells": cells});
            match include {
                IncludeObject::None => {}
                IncludeObject::Object => row["object"] = (*object).clone(),
                IncludeObject::Metadata => {
                    let mut metadata = object["metadata"].clone();
                    if let Some(m) = metadata.as_object_mut() {
                        m.remove("managedFields");
                    }
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": metadata,
                    });
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn durations_read_like_kubectl() {
        for (secs, text) in [
            (0, "0s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (20 * 3600, "20h"),
            (50 * 3600, "2d2h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 10 * 86400, "3y10d"),
            (-5, "<invalid>"),
        ] {
            assert_eq!(human_duration(secs), text, "{secs}s");
        }
    }
}
