//! Server-side printing: `meta.k8s.io/v1` `Table` responses built from a resource's printer
//! columns.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::resource::{Column, Resource};

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
