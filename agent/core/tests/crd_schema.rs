//! The generated CRDs carry what users rely on: names, printer columns, structural schemas,
//! list-map markers and the CEL rules, each proven by evaluating it.

mod common;

use common::schema_of;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::core::cel::Validator;
use kuport_core::api::{PortMap, PortMapClass};
use kuport_testkit::objects::{self, base_portmap_spec, kuport_object, none_spec};
use serde_json::{Value, json};

fn columns(crd: &CustomResourceDefinition) -> Vec<(String, String, i32)> {
    crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .expect("printer columns")
        .iter()
        .map(|c| {
            (
                c.name.to_uppercase(),
                c.json_path.clone(),
                c.priority.unwrap_or(0),
            )
        })
        .collect()
}

fn col(name: &str, path: &str, priority: i32) -> (String, String, i32) {
    (name.to_owned(), path.to_owned(), priority)
}

#[test]
fn class_names_scope_and_subresources() {
    let crd = PortMapClass::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("portmapclasses.kuport.wlz.li")
    );
    assert_eq!(crd.spec.group, "kuport.wlz.li");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["pmc".to_owned()][..])
    );
    assert_eq!(
        crd.spec.names.categories.as_deref(),
        Some(&["kuport".to_owned()][..])
    );
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.served && version.storage);
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
}

#[test]
fn portmap_names_scope_and_subresources() {
    let crd = PortMap::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("portmaps.kuport.wlz.li"));
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["pm".to_owned()][..])
    );
    assert_eq!(
        crd.spec.names.categories.as_deref(),
        Some(&["kuport".to_owned()][..])
    );
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
}

#[test]
fn class_printer_columns() {
    assert_eq!(
        columns(&PortMapClass::crd()),
        [
            col("MODE", ".spec.returnPath.mode", 0),
            col("SERVING", ".spec.servingMode", 0),
            col(
                "READY",
                ".status.conditions[?(@.type==\"Ready\")].status",
                0
            ),
            col("NODES", ".status.nodesSummary", 0),
            col("AGE", ".metadata.creationTimestamp", 0),
        ]
    );
}

#[test]
fn portmap_printer_columns() {
    assert_eq!(
        columns(&PortMap::crd()),
        [
            col("CLASS", ".spec.className", 0),
            col("PROTO", ".spec.protocol", 0),
            col("PORT", ".spec.port", 0),
            col("END", ".spec.endPort", 0),
            col("ENDPOINT", ".status.endpoint.address", 0),
            col(
                "PROGRAMMED",
                ".status.conditions[?(@.type==\"Programmed\")].status",
                0
            ),
            col("PUBLISHED", ".status.publishedSummary", 0),
            col("AGE", ".metadata.creationTimestamp", 0),
            col("NODE", ".status.endpoint.node", 1),
            col(
                "REASON",
                ".status.conditions[?(@.type==\"Programmed\")].reason",
                1
            ),
        ]
    );
}

/// Collects every place in a schema that is not structural in the API server's sense: a
/// property without a type, a tuple (`items` as an array), or constructs the server forbids at
/// that level (`$ref`, `anyOf`/`oneOf`/`allOf` without a typed node around them).
fn structural_violations(schema: &Value, path: &str, out: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    let escapes = obj.contains_key("x-kubernetes-int-or-string")
        || obj.contains_key("x-kubernetes-preserve-unknown-fields");
    if !obj.contains_key("type") && !escapes {
        out.push(format!("{path}: no type"));
    }
    for forbidden in ["$ref", "anyOf", "oneOf", "allOf", "not"] {
        if obj.contains_key(forbidden) {
            out.push(format!("{path}: uses {forbidden}"));
        }
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            structural_violations(prop, &format!("{path}.{name}"), out);
        }
    }
    match obj.get("items") {
        Some(Value::Array(_)) => out.push(format!("{path}: tuple items")),
        Some(items) => structural_violations(items, &format!("{path}[]"), out),
        None if obj.get("type") == Some(&json!("array")) => {
            out.push(format!("{path}: array without items"))
        }
        None => {}
    }
    if let Some(extra) = obj
        .get("additionalProperties")
        .filter(|extra| extra.is_object())
    {
        structural_violations(extra, &format!("{path}{{}}"), out);
    }
}

#[test]
fn schemas_are_structural() {
    for crd in [PortMapClass::crd(), PortMap::crd()] {
        let mut violations = Vec::new();
        structural_violations(&schema_of(&crd), "", &mut violations);
        assert!(
            violations.is_empty(),
            "{:?}: {violations:#?}",
            crd.metadata.name
        );
    }
}

#[test]
fn structural_check_catches_an_untyped_property_and_a_tuple() {
    let bad = json!({"type": "object", "properties": {
        "loose": {"description": "no type"},
        "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}
    }});
    let mut violations = Vec::new();
    structural_violations(&bad, "", &mut violations);
    assert_eq!(violations, [".loose: no type", ".pair: tuple items"]);
}

fn pointer<'a>(schema: &'a Value, path: &str) -> &'a Value {
    schema
        .pointer(path)
        .unwrap_or_else(|| panic!("schema has no {path}"))
}

#[test]
fn status_lists_are_list_maps() {
    let class = schema_of(&PortMapClass::crd());
    for (list, key) in [("conditions", "type"), ("nodes", "name"), ("links", "key")] {
        let node = pointer(&class, &format!("/properties/status/properties/{list}"));
        assert_eq!(node["x-kubernetes-list-type"], "map", "class status.{list}");
        assert_eq!(
            node["x-kubernetes-list-map-keys"],
            json!([key]),
            "class status.{list}"
        );
        let required = node["items"]["required"].as_array().expect("required keys");
        assert!(
            required.contains(&json!(key)),
            "a list-map key must be required: {list}.{key}"
        );
    }
    let pm = schema_of(&PortMap::crd());
    let conditions = pointer(&pm, "/properties/status/properties/conditions");
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
}

#[test]
fn conditions_have_the_standard_shape() {
    for crd in [PortMapClass::crd(), PortMap::crd()] {
        let schema = schema_of(&crd);
        let item = pointer(&schema, "/properties/status/properties/conditions/items");
        assert_eq!(
            item["required"],
            json!(["lastTransitionTime", "message", "reason", "status", "type"])
        );
        assert_eq!(item["properties"]["observedGeneration"]["type"], "integer");
    }
}

#[test]
fn bounds_and_enums() {
    let class = schema_of(&PortMapClass::crd());
    let spec = "/properties/spec/properties";
    for field in [
        "ports/properties/min",
        "ports/properties/max",
        "ports/properties/reserved/items",
        "returnPath/properties/vxlan/properties/port",
    ] {
        let node = pointer(&class, &format!("{spec}/{field}"));
        assert_eq!(node["minimum"].as_f64(), Some(1.0), "{field}");
        assert_eq!(node["maximum"].as_f64(), Some(65535.0), "{field}");
    }
    let vni = pointer(
        &class,
        &format!("{spec}/returnPath/properties/vxlan/properties/vni"),
    );
    assert_eq!(
        (vni["minimum"].as_f64(), vni["maximum"].as_f64()),
        (Some(1.0), Some(16777215.0))
    );
    assert_eq!(
        pointer(&class, &format!("{spec}/servingMode/enum")),
        &json!(["Single", "Multi"])
    );
    assert_eq!(
        pointer(&class, &format!("{spec}/returnPath/properties/mode/enum")),
        &json!(["Vxlan", "None"])
    );
    assert_eq!(
        pointer(&class, &format!("{spec}/nodes/minProperties")),
        &json!(1)
    );
    assert_eq!(
        pointer(
            &class,
            &format!("{spec}/nodes/additionalProperties/properties/interfaces/minItems")
        ),
        &json!(1)
    );
    assert_eq!(
        pointer(&class, "/properties/spec/required"),
        &json!(["nodes", "returnPath"])
    );

    let pm = schema_of(&PortMap::crd());
    for field in ["port", "endPort"] {
        let node = pointer(&pm, &format!("{spec}/{field}"));
        assert_eq!(
            (node["minimum"].as_f64(), node["maximum"].as_f64()),
            (Some(1.0), Some(65535.0))
        );
    }
    assert_eq!(
        pointer(&pm, &format!("{spec}/protocol/enum")),
        &json!(["TCP", "UDP"])
    );
    assert_eq!(
        pointer(&pm, &format!("{spec}/className/minLength")),
        &json!(1)
    );
    assert_eq!(
        pointer(&pm, "/properties/spec/required"),
        &json!(["className", "port", "protocol", "serviceRef"])
    );
}

#[test]
fn every_field_has_a_description() {
    fn walk(schema: &Value, path: &str, out: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, prop) in props {
                let here = format!("{path}.{name}");
                if prop
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    out.push(here.clone());
                }
                walk(prop, &here, out);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(items, &format!("{path}[]"), out);
        }
        if let Some(extra) = schema.get("additionalProperties") {
            walk(extra, &format!("{path}{{}}"), out);
        }
    }
    for crd in [PortMapClass::crd(), PortMap::crd()] {
        let schema = schema_of(&crd);
        let mut missing = Vec::new();
        for top in ["spec", "status"] {
            walk(&schema["properties"][top], top, &mut missing);
        }
        assert!(
            missing.is_empty(),
            "{:?} fields without description: {missing:#?}",
            crd.metadata.name
        );
    }
}

// --- CEL rules, evaluated with the kube-rs CEL implementation the API server model uses ---

fn portmap(spec: Value) -> Value {
    kuport_object(
        "PortMap",
        json!({"name": "game", "namespace": "games"}),
        spec,
    )
}

fn with(mut spec: Value, field: &str, value: Value) -> Value {
    if value.is_null() {
        spec.as_object_mut()
            .expect("spec is an object")
            .remove(field);
    } else {
        spec[field] = value;
    }
    spec
}

fn pm_errors(new: &Value, old: Option<&Value>) -> Vec<String> {
    let schema = schema_of(&PortMap::crd());
    match Validator::new().validate(&schema, new, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn cel_accepts_a_valid_portmap_and_a_single_port() {
    assert_eq!(
        pm_errors(&portmap(base_portmap_spec()), None),
        Vec::<String>::new()
    );
    let single = with(base_portmap_spec(), "endPort", Value::Null);
    assert_eq!(pm_errors(&portmap(single), None), Vec::<String>::new());
    let equal = with(base_portmap_spec(), "endPort", json!(3000));
    assert_eq!(pm_errors(&portmap(equal), None), Vec::<String>::new());
}

#[test]
fn cel_refuses_end_port_below_port() {
    let bad = portmap(with(base_portmap_spec(), "endPort", json!(2999)));
    let errors = pm_errors(&bad, None);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("endPort must not be lower than port"),
        "{errors:?}"
    );
}

#[test]
fn cel_refuses_changing_each_immutable_field() {
    let old = portmap(base_portmap_spec());
    let cases = [
        ("className", json!("intranet"), "className is immutable"),
        ("protocol", json!("TCP"), "protocol is immutable"),
        ("port", json!(3001), "port is immutable"),
        ("endPort", json!(3010), "endPort is immutable"),
        ("endPort", Value::Null, "endPort is immutable"),
    ];
    for (field, value, expected) in cases {
        let new = portmap(with(base_portmap_spec(), field, value.clone()));
        let errors = pm_errors(&new, Some(&old));
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "changing {field} to {value}: expected {expected:?}, got {errors:?}"
        );
    }
    // Adding an endPort to a single-port mapping is a change too.
    let old_single = portmap(with(base_portmap_spec(), "endPort", Value::Null));
    let errors = pm_errors(&portmap(base_portmap_spec()), Some(&old_single));
    assert!(
        errors.iter().any(|e| e.contains("endPort is immutable")),
        "{errors:?}"
    );
}

#[test]
fn cel_allows_changing_interfaces_and_service_ref() {
    let old = portmap(base_portmap_spec());
    let mut spec = with(base_portmap_spec(), "interfaces", json!(["wt0"]));
    spec["serviceRef"] = json!({"name": "other", "port": "game"});
    assert_eq!(pm_errors(&portmap(spec), Some(&old)), Vec::<String>::new());
}

fn class(ports: Value) -> Value {
    let mut spec = none_spec(&[("a", &["eth0"])]);
    spec["ports"] = ports;
    objects::class("c", spec).object()
}

fn class_errors(obj: &Value) -> Vec<String> {
    let schema = schema_of(&PortMapClass::crd());
    match Validator::new().validate(&schema, obj, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn cel_refuses_ports_min_above_max() {
    let errors = class_errors(&class(json!({"min": 2000, "max": 1000})));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("ports.min must not exceed ports.max"),
        "{errors:?}"
    );
    assert_eq!(
        class_errors(&class(json!({"min": 1000, "max": 1000}))),
        Vec::<String>::new()
    );
    // With the defaults applied the rule holds for partial windows too.
    assert_eq!(
        class_errors(&class(json!({"min": 1000}))),
        Vec::<String>::new()
    );
    assert_eq!(class_errors(&class(json!({}))), Vec::<String>::new());
    let errors = class_errors(&class(json!({"max": 0})));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("ports.min must not exceed ports.max")),
        "{errors:?}"
    );
}
