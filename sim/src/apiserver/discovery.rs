//! Discovery (`/api`, `/apis`, aggregated v2 and the legacy per-group-version lists),
//! `/version`, and `/openapi/v3` built from the CRD schemas: what kubectl reads before it does
//! anything (what kubectl 1.3x requests, recorded when the model was written).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::Inner;
use super::resource::Resource;
use super::response::json_response;

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Answers a discovery or OpenAPI path, or `None` when the path is not one.
pub(crate) fn serve(inner: &Inner, segments: &[&str], accept: &str) -> Option<Response> {
    let aggregated = accept.contains("as=APIGroupDiscoveryList");
    let response = match segments {
        ["version"] => json_response(
            200,
            &json!({
                "major": "1", "minor": "37", "gitVersion": "v1.37.0-kuport-sim",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "none", "compiler": "kuport-sim",
                "platform": "linux/amd64",
            }),
        ),
        ["api"] if aggregated => aggregated_response(&[group_discovery(inner, "", "v1")]),
        ["api"] => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}),
        ),
        ["apis"] if aggregated => {
            let items: Vec<Value> = group_versions(inner)
                .iter()
                .filter(|(g, _)| !g.is_empty())
                .map(|(g, v)| group_discovery(inner, g, v))
                .collect();
            aggregated_response(&items)
        }
        ["apis"] => {
            let groups: Vec<Value> = group_versions(inner)
                .iter()
                .filter(|(g, _)| !g.is_empty())
                .map(|(g, v)| api_group(g, v))
                .collect();
            json_response(
                200,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            )
        }
        ["api", "v1"] => json_response(200, &resource_list(inner, "", "v1")),
        ["apis", g] => {
            let (_, v) = group_versions(inner).into_iter().find(|(gg, _)| gg == g)?;
            json_response(200, &{
                let mut group = api_group(g, &v);
                group["kind"] = json!("APIGroup");
                group["apiVersion"] = json!("v1");
                group
            })
        }
        ["apis", g, v]
            if inner
                .resources
                .iter()
                .any(|r| r.group == *g && r.version == *v) =>
        {
            json_response(200, &resource_list(inner, g, v))
        }
        ["openapi", "v3"] => {
            let mut paths = Map::new();
            for (g, v) in group_versions(inner) {
                let key = gv_path(&g, &v);
                let hash = fnv64(openapi_document(inner, &g, &v).to_string().as_bytes());
                paths.insert(
                    key.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash:016X}")}),
                );
            }
            json_response(200, &json!({"paths": paths}))
        }
        ["openapi", "v3", "api", "v1"] => json_response(200, &openapi_document(inner, "", "v1")),
        ["openapi", "v3", "apis", g, v]
            if inner
                .resources
                .iter()
                .any(|r| r.group == *g && r.version == *v) =>
        {
            json_response(200, &openapi_document(inner, g, v))
        }
        _ => return None,
    };
    Some(response)
}

fn aggregated_response(items: &[Value]) -> Response {
    let body = json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, AGGREGATED)],
        body.to_string(),
    )
        .into_response()
}

/// Distinct (group, version) pairs in serving order, the core group first.
fn group_versions(inner: &Inner) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for r in &inner.resources {
        let gv = (r.group.clone(), r.version.clone());
        if !out.contains(&gv) {
            out.push(gv);
        }
    }
    out
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn api_group(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

fn in_gv<'a>(
    inner: &'a Inner,
    group: &'a str,
    version: &'a str,
) -> impl Iterator<Item = &'a Resource> {
    inner
        .resources
        .iter()
        .filter(move |r| r.group == group && r.version == version)
}

fn group_discovery(inner: &Inner, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = in_gv(inner, group, version)
        .map(|r| {
            let kind = json!({"group": r.group, "version": r.version, "kind": r.kind});
            let mut entry = json!({
                "resource": r.plural,
                "responseKind": kind,
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": VERBS,
            });
            if !r.short_names.is_empty() {
                entry["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                entry["categories"] = json!(r.categories);
            }
            if r.status_subresource {
                entry["subresources"] = json!([{
                    "subresource": "status", "responseKind": kind, "verbs": ["get", "patch", "update"],
                }]);
            }
            entry
        })
        .collect();
    let mut metadata = json!({"creationTimestamp": null});
    if !group.is_empty() {
        metadata["name"] = json!(group);
    }
    json!({
        "metadata": metadata,
        "versions": [{"version": version, "resources": resources, "freshness": "Current"}],
    })
}

fn resource_list(inner: &Inner, group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in in_gv(inner, group, version) {
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        resources.push(entry);
        if r.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

/// The OpenAPI component name of a kind: `io.k8s.api.core.v1.Namespace`,
/// `io.k8s.api.discovery.v1.EndpointSlice`, `li.wlz.kuport.v1alpha1.PortMap`.
fn schema_name(r: &Resource) -> String {
    if r.custom.is_some() {
        let reversed: Vec<&str> = r.group.split('.').rev().collect();
        format!("{}.{}.{}", reversed.join("."), r.version, r.kind)
    } else {
        let short = if r.group.is_empty() {
            "core"
        } else {
            r.group.split('.').next().unwrap_or(&r.group)
        };
        format!("io.k8s.api.{short}.{}.{}", r.version, r.kind)
    }
}

fn object_meta_schema() -> Value {
    let string = |d: &str| json!({"type": "string", "description": d});
    let map = |d: &str| {
        json!({"type": "object", "description": d,
               "additionalProperties": {"type": "string", "default": ""}})
    };
    json!({
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "properties": {
            "name": string("Name must be unique within a namespace. Cannot be updated."),
            "generateName": string("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
            "namespace": string("Namespace defines the space within which each name must be unique."),
            "uid": string("UID is the unique in time and space value for this object. Populated by the system. Read-only."),
            "resourceVersion": string("An opaque value that represents the internal version of this object, used for optimistic concurrency. Populated by the system. Read-only."),
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state. Populated by the system. Read-only."},
            "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is when this object was created. Populated by the system. Read-only."},
            "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is when this resource will be deleted, set when a deletion is requested of an object with finalizers. Read-only."},
            "deletionGracePeriodSeconds": {"type": "integer", "format": "int64", "description": "Number of seconds allowed for this object to gracefully terminate. Read-only."},
            "labels": map("Map of string keys and values that can be used to organize and categorize (scope and select) objects."),
            "annotations": map("Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata."),
            "finalizers": {"type": "array", "items": {"type": "string", "default": ""},
                           "description": "Must be empty before the object is deleted from the registry."},
            "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                "description": "List of objects depended by this object."},
        },
    })
}

fn kind_schema(r: &Resource) -> Value {
    let gvk = json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
    let mut schema = match &r.custom {
        Some(custom) => custom.schema.clone(),
        None => json!({
            "type": "object",
            "description": format!("{} (the model keeps built-in kinds schemaless).", r.kind),
            "x-kubernetes-preserve-unknown-fields": true,
        }),
    };
    let props = &mut schema["properties"];
    if !props.is_object() {
        *props = json!({});
    }
    props["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
    props["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
    props["metadata"] = json!({
        "allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}],
        "default": {},
        "description": "Standard object's metadata.",
    });
    schema["x-kubernetes-group-version-kind"] = gvk;
    schema
}

/// The OpenAPI v3 document of one group version: every path with its operations (each carrying
/// `x-kubernetes-group-version-kind`, writes carrying the `fieldValidation` parameter kubectl
/// looks for before trusting server-side validation) and every kind's schema.
fn openapi_document(inner: &Inner, group: &str, version: &str) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    schemas.insert(OBJECT_META.to_owned(), object_meta_schema());
    let write_params = json!([
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true},
         "description": "When present, indicates that modifications should not be persisted."},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true},
         "description": "fieldManager is a name associated with the actor or entity that is making these changes."},
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true},
         "description": "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields."},
    ]);
    let prefix = format!("/{}", gv_path(group, version));
    for r in in_gv(inner, group, version) {
        resource_paths(r, &prefix, &write_params, &mut paths);
        schemas.insert(schema_name(r), kind_schema(r));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "kuport-sim", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// The paths of resource `r` under `prefix` (its group version's), each with its operations:
/// the collection, the all-namespaces list of a namespaced kind, the object and its status.
fn resource_paths(
    r: &Resource,
    prefix: &str,
    write_params: &Value,
    paths: &mut Map<String, Value>,
) {
    let reference = json!({"$ref": format!("#/components/schemas/{}", schema_name(r))});
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
    let body = json!({"content": {"application/json": {"schema": reference}}});
    let mut patch_types = vec![
        "application/json-patch+json",
        "application/merge-patch+json",
    ];
    if r.custom.is_none() {
        patch_types.push("application/strategic-merge-patch+json");
    }
    let patch_body: Map<String, Value> = patch_types
        .iter()
        .map(|t| ((*t).to_owned(), json!({"schema": {"type": "object"}})))
        .collect();
    let op = |action: &str, id: &str, extra: Value| {
        let mut o = json!({
            "operationId": format!("{id}{}", r.kind),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "responses": ok,
        });
        if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
            o.extend(extra.clone());
        }
        o
    };
    let collection = if r.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("{prefix}/{}", r.plural)
    };
    paths.insert(
        collection.clone(),
        json!({
            "get": op("list", "list", json!({})),
            "post": op("post", "create", json!({"requestBody": body, "parameters": write_params})),
            "delete": op("deletecollection", "deleteCollection", json!({})),
        }),
    );
    if r.namespaced {
        paths.insert(
            format!("{prefix}/{}", r.plural),
            json!({"get": op("list", "listAllNamespaces", json!({}))}),
        );
    }
    let item_ops = json!({
        "get": op("get", "read", json!({})),
        "put": op("put", "replace", json!({"requestBody": body, "parameters": write_params})),
        "patch": op("patch", "patch", json!({"requestBody": {"content": patch_body}, "parameters": write_params})),
        "delete": op("delete", "delete", json!({})),
        "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
    });
    paths.insert(format!("{collection}/{{name}}"), item_ops);
    if r.status_subresource {
        paths.insert(
            format!("{collection}/{{name}}/status"),
            json!({
                "get": op("get", "readStatus", json!({})),
                "put": op("put", "replaceStatus", json!({"requestBody": body, "parameters": write_params})),
                "patch": op("patch", "patchStatus", json!({"requestBody": {"content": patch_body}, "parameters": write_params})),
            }),
        );
    }
}

/// FNV-1a: a stable content hash for the OpenAPI index, so kubectl's cache key changes exactly
/// when the document does.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}
