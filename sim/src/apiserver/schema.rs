//! Admission of custom resources the way kube-apiserver does it for a structural CRD schema:
//! prune unknown fields (or refuse them under `fieldValidation=Strict`), drop `null`s the schema
//! does not allow, apply defaults, check the OpenAPI constraints, then evaluate the CEL rules
//! (`x-kubernetes-validations`, with `oldSelf` on updates) with kube-rs's CEL implementation.

use kube::core::cel::{ErrorKind, Validator};
use serde_json::{Map, Value};

use super::error::Cause;

/// Joins a field path the way Kubernetes field errors print it.
fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Removes fields the schema does not declare, collecting their paths, and `null`s of fields
/// that are neither nullable nor defaulted (the server drops those before defaulting).
pub fn prune(schema: &Value, value: &mut Value, path: &str, unknown: &mut Vec<String>) {
    if schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return;
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let here = join(path, &key);
                let child_schema = match (props.and_then(|p| p.get(&key)), additional) {
                    (Some(s), _) => Some(s),
                    (None, Some(extra)) if extra.is_object() => Some(extra),
                    (None, Some(Value::Bool(true))) => None,
                    _ => {
                        // Only a schema that declares properties prunes; a bare `type: object`
                        // keeps what it holds, like the real server's `x-preserve` default
                        // for the embedded metadata.
                        if props.is_some() || additional.is_some() {
                            map.remove(&key);
                            unknown.push(here);
                        }
                        continue;
                    }
                };
                let Some(child_schema) = child_schema else {
                    continue;
                };
                let nullable = child_schema.get("nullable").and_then(Value::as_bool) == Some(true);
                if map.get(&key).is_some_and(Value::is_null) && !nullable {
                    map.remove(&key);
                    continue;
                }
                if let Some(child) = map.get_mut(&key) {
                    prune(child_schema, child, &here, unknown);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item_schema, item, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The value as Go's field errors print it: strings quoted, numbers bare, composites by type.
fn shown(value: &Value) -> String {
    match value {
        Value::Object(_) => "\"object\"".to_owned(),
        Value::Array(_) => "\"array\"".to_owned(),
        other => other.to_string(),
    }
}

fn invalid(path: &str, value: &Value, what: &str) -> Cause {
    Cause::new(
        "FieldValueInvalid",
        path,
        format!("Invalid value: {}: {path} in body {what}", shown(value)),
    )
}

fn number(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key).and_then(Value::as_f64)
}

fn count(schema: &Value, key: &str) -> Option<usize> {
    schema
        .get(key)
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
}

/// Formats a bound as the server does: integral bounds without a fraction.
fn bound(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// Checks the OpenAPI constraints: type, nullable, enum, minimum/maximum (and exclusive),
/// minLength/maxLength, minItems/maxItems, minProperties/maxProperties, required, and the
/// uniqueness of list-map keys and list-set items.
pub fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<Cause>) {
    if value.is_null() {
        check_null(schema, path, out);
        return;
    }
    if !check_type(schema, value, path, out) {
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(Cause::new(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                value,
                list.join(", ")
            ),
        ));
    }
    match value {
        Value::Number(n) => check_number(schema, value, n.as_f64().unwrap_or(0.0), path, out),
        Value::String(s) => check_string(schema, value, s, path, out),
        Value::Array(items) => check_array(schema, value, items, path, out),
        Value::Object(map) => check_object(schema, value, map, path, out),
        _ => {}
    }
}

/// A `null` is an error unless the schema is nullable.
fn check_null(schema: &Value, path: &str, out: &mut Vec<Cause>) {
    if schema.get("nullable").and_then(Value::as_bool) != Some(true) {
        out.push(Cause::new(
            "FieldValueTypeInvalid",
            path,
            format!(
                "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                schema
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("object")
            ),
        ));
    }
}

/// Whether `value` has the schema's type (an integer is a number; `int-or-string` takes either).
/// A value of the wrong type gets no further checks.
fn check_type(schema: &Value, value: &Value, path: &str, out: &mut Vec<Cause>) -> bool {
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let got = type_name(value);
        let ok = got == want || (want == "number" && got == "integer");
        if !ok && !int_or_string {
            out.push(Cause::new(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""
                ),
            ));
            return false;
        }
    }
    true
}

/// `maximum` and `minimum`, each exclusive or not.
fn check_number(schema: &Value, value: &Value, x: f64, path: &str, out: &mut Vec<Cause>) {
    let exclusive_max = schema.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
    let exclusive_min = schema.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
    if let Some(max) = number(schema, "maximum") {
        if exclusive_max && x >= max {
            out.push(invalid(
                path,
                value,
                &format!("should be less than {}", bound(max)),
            ));
        } else if x > max {
            out.push(invalid(
                path,
                value,
                &format!("should be less than or equal to {}", bound(max)),
            ));
        }
    }
    if let Some(min) = number(schema, "minimum") {
        if exclusive_min && x <= min {
            out.push(invalid(
                path,
                value,
                &format!("should be greater than {}", bound(min)),
            ));
        } else if x < min {
            out.push(invalid(
                path,
                value,
                &format!("should be greater than or equal to {}", bound(min)),
            ));
        }
    }
}

/// `minLength` and `maxLength`, in characters.
fn check_string(schema: &Value, value: &Value, s: &str, path: &str, out: &mut Vec<Cause>) {
    let len = s.chars().count();
    if let Some(min) = count(schema, "minLength")
        && len < min
    {
        out.push(invalid(
            path,
            value,
            &format!("should be at least {min} chars long"),
        ));
    }
    if let Some(max) = count(schema, "maxLength")
        && len > max
    {
        out.push(Cause::new(
            "FieldValueTooLong",
            path,
            format!("Too long: may not be more than {max} bytes"),
        ));
    }
}

/// `minItems`, `maxItems`, the list type's uniqueness, then every item.
fn check_array(schema: &Value, value: &Value, items: &[Value], path: &str, out: &mut Vec<Cause>) {
    if let Some(min) = count(schema, "minItems")
        && items.len() < min
    {
        out.push(invalid(
            path,
            value,
            &format!("should have at least {min} items"),
        ));
    }
    if let Some(max) = count(schema, "maxItems")
        && items.len() > max
    {
        out.push(Cause::new(
            "FieldValueTooMany",
            path,
            format!("Too many: {}: must have at most {max} items", items.len()),
        ));
    }
    check_list_uniqueness(schema, items, path, out);
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
}

/// `minProperties`, `maxProperties`, `required`, then every property.
fn check_object(
    schema: &Value,
    value: &Value,
    map: &Map<String, Value>,
    path: &str,
    out: &mut Vec<Cause>,
) {
    if let Some(min) = count(schema, "minProperties")
        && map.len() < min
    {
        out.push(invalid(
            path,
            value,
            &format!("should have at least {min} properties"),
        ));
    }
    if let Some(max) = count(schema, "maxProperties")
        && map.len() > max
    {
        out.push(invalid(
            path,
            value,
            &format!("should have at most {max} properties"),
        ));
    }
    for req in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(req) {
            out.push(Cause::new(
                "FieldValueRequired",
                join(path, req),
                "Required value",
            ));
        }
    }
    check_properties(schema, map, path, out);
}

fn check_properties(schema: &Value, map: &Map<String, Value>, path: &str, out: &mut Vec<Cause>) {
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (key, child) in map {
        if let Some(child_schema) = props.and_then(|p| p.get(key)) {
            check(child_schema, child, &join(path, key), out);
        } else if let Some(extra) = additional {
            check(extra, child, &format!("{path}[{key}]"), out);
        }
    }
}

fn check_list_uniqueness(schema: &Value, items: &[Value], path: &str, out: &mut Vec<Cause>) {
    let list_type = schema.get("x-kubernetes-list-type").and_then(Value::as_str);
    let keys: Vec<&str> = schema
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let identity = |item: &Value| -> Value {
        match list_type {
            Some("map") => Value::Object(
                keys.iter()
                    .map(|k| {
                        (
                            (*k).to_owned(),
                            item.get(*k).cloned().unwrap_or(Value::Null),
                        )
                    })
                    .collect(),
            ),
            _ => item.clone(),
        }
    };
    if !matches!(list_type, Some("map") | Some("set")) {
        return;
    }
    let mut seen: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let id = identity(item);
        if seen.contains(&id) {
            out.push(Cause::new(
                "FieldValueDuplicate",
                format!("{path}[{i}]"),
                format!("Duplicate value: {id}"),
            ));
        } else {
            seen.push(id);
        }
    }
}

/// Evaluates the schema's CEL rules against the (defaulted) object, and its old version for
/// transition rules, returning one cause per failed rule. A rule that cannot be evaluated is a
/// failure too (fail closed, as the real server refuses on an evaluation error).
pub fn check_cel(schema: &Value, object: &Value, old: Option<&Value>) -> Vec<Cause> {
    match Validator::new().validate(schema, object, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| {
                let field = e.field_path.clone();
                let value = scalar_at(object, &field);
                let message = match (&e.kind, value) {
                    // The real server (1.37) quotes a scalar's value and leaves an object's out:
                    // `spec: Invalid value: endPort is immutable: ...`.
                    (ErrorKind::ValidationFailure, Some(value)) => {
                        format!("Invalid value: {}: {}", shown(&value), e.message)
                    }
                    (ErrorKind::ValidationFailure, None) => format!("Invalid value: {}", e.message),
                    _ => format!("Internal error: rule {:?}: {}", e.rule, e.message),
                };
                let reason = match e.reason.as_deref() {
                    Some("FieldValueRequired") => "FieldValueRequired",
                    Some("FieldValueForbidden") => "FieldValueForbidden",
                    Some("FieldValueDuplicate") => "FieldValueDuplicate",
                    _ if e.kind == ErrorKind::ValidationFailure => "FieldValueInvalid",
                    _ => "InternalError",
                };
                Cause::new(reason, field, message)
            })
            .collect(),
    }
}

/// The scalar at a dotted field path (`spec.port`); `None` when the path names an object or
/// nothing.
fn scalar_at(object: &Value, path: &str) -> Option<Value> {
    path.split('.')
        .filter(|s| !s.is_empty())
        .try_fold(object, |v, k| v.get(k))
        .filter(|v| !v.is_object())
        .cloned()
}

/// Whether a name is a DNS-1123 subdomain (most kinds) or, with `label`, a DNS-1123 label
/// (namespaces).
pub fn name_problem(name: &str, label: bool) -> Option<String> {
    let max = if label { 63 } else { 253 };
    if name.len() > max {
        return Some(format!("must be no more than {max} characters"));
    }
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !p.starts_with('-')
            && !p.ends_with('-')
    };
    let ok = if label {
        part_ok(name)
    } else {
        name.split('.').all(part_ok)
    };
    if ok {
        None
    } else if label {
        Some("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_owned())
    } else {
        Some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prune_drops_undeclared_fields_and_disallowed_nulls() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "string", "nullable": true},
            "m": {"type": "object", "additionalProperties": {"type": "string"}}}});
        let mut v = json!({"a": null, "b": null, "c": 1, "m": {"x": "y"}});
        let mut unknown = Vec::new();
        prune(&schema, &mut v, "spec", &mut unknown);
        assert_eq!(v, json!({"b": null, "m": {"x": "y"}}));
        assert_eq!(unknown, ["spec.c"]);
    }

    #[test]
    fn check_reports_each_constraint_with_its_field() {
        let schema = json!({"type": "object", "required": ["r"], "properties": {
            "port": {"type": "integer", "minimum": 1.0, "maximum": 65535.0},
            "proto": {"type": "string", "enum": ["TCP", "UDP"]},
            "name": {"type": "string", "minLength": 1},
            "list": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "map": {"type": "object", "minProperties": 1}}});
        let v = json!({"port": 70000, "proto": "SCTP", "name": "", "list": [], "map": {}});
        let mut out = Vec::new();
        check(&schema, &v, "spec", &mut out);
        out.sort_by(|a, b| a.field.cmp(&b.field));
        let fields: Vec<(&str, &str)> = out.iter().map(|c| (c.field.as_str(), c.reason)).collect();
        assert_eq!(
            fields,
            [
                ("spec.list", "FieldValueInvalid"),
                ("spec.map", "FieldValueInvalid"),
                ("spec.name", "FieldValueInvalid"),
                ("spec.port", "FieldValueInvalid"),
                ("spec.proto", "FieldValueNotSupported"),
                ("spec.r", "FieldValueRequired"),
            ]
        );
        assert!(
            out[3]
                .message
                .contains("should be less than or equal to 65535")
        );
    }

    #[test]
    fn wrong_types_and_duplicate_list_map_keys_are_refused() {
        let schema = json!({"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
            "items": {"type": "object", "properties": {"type": {"type": "string"}}}});
        let mut out = Vec::new();
        check(
            &schema,
            &json!([{"type": "A"}, {"type": "A"}, {"type": 3}]),
            "c",
            &mut out,
        );
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[0].reason, "FieldValueDuplicate");
        assert_eq!(out[1].reason, "FieldValueTypeInvalid");
    }

    #[test]
    fn names_follow_dns_1123() {
        assert_eq!(name_problem("games", true), None);
        assert_eq!(name_problem("a.b-c", false), None);
        assert!(name_problem("a.b", true).is_some());
        assert!(name_problem("Upper", false).is_some());
        assert!(name_problem("-x", false).is_some());
        assert!(name_problem("", false).is_some());
    }
}
