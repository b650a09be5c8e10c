//! What the model knows of one served resource: names, scope, subresources, field selectors,
//! printer columns, schema and storage. Every other part of the model reads these; the list of
//! resources itself is built in `catalog`.

use serde_json::{Value, json};

use super::jsonpath::JsonPath;

/// One served resource (a group, version and plural).
#[derive(Debug)]
pub struct Resource {
    /// API group; empty for the core group.
    pub group: String,
    /// API version, e.g. `v1`.
    pub version: String,
    /// Plural resource name used in URLs.
    pub plural: String,
    /// Singular name (discovery).
    pub singular: String,
    /// Kind of the objects.
    pub kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names kubectl accepts (`pm`, `pmc`, `ns`, ...).
    pub short_names: Vec<String>,
    /// Categories (`kubectl get kuport`).
    pub categories: Vec<String>,
    /// Whether the kind has a `status` subresource: then the main resource cannot change status
    /// and the subresource cannot change anything else.
    pub status_subresource: bool,
    /// Whether `status` sent on create is kept. The real server drops it for custom resources and
    /// Services, and keeps it for Nodes (the kubelet registers a Node with its status).
    pub keep_status_on_create: bool,
    /// Field-selector labels beyond `metadata.name` and `metadata.namespace`, with the JSON path
    /// each reads (the real server supports a fixed set per kind and refuses others).
    pub field_labels: Vec<(&'static str, &'static [&'static str])>,
    /// Whether the real server selects this kind with apimachinery's default conversion (only
    /// `metadata.name` and `metadata.namespace`), which words a refusal differently.
    pub default_field_conversion: bool,
    /// Server-side printing columns after `Name`.
    pub columns: Vec<Column>,
    /// For custom resources: the CRD's schema and name.
    pub custom: Option<Custom>,
    /// For a view of another resource's objects (`events.k8s.io/v1` Events are core `v1`
    /// Events in storage): the index of the resource that stores them.
    pub stored_as: Option<usize>,
    /// How this resource's fields map to the storing resource's (with `stored_as`).
    pub conversion: Option<Conversion>,
}

/// What the model reads from a CRD beyond names and columns.
#[derive(Debug)]
pub struct Custom {
    /// The CRD's `metadata.name`.
    pub crd_name: String,
    /// The served version's `openAPIV3Schema`, as JSON.
    pub schema: Value,
}

impl Resource {
    /// `apiVersion` of the objects: `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource as errors name it: `configmaps` or `portmaps.kuport.wlz.li`.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The `details` of a `Status` about one object of this resource.
    pub fn details(&self, name: &str) -> Value {
        json!({"name": name, "group": self.group, "kind": self.plural})
    }

    /// The JSON path of a field-selector label, or `None` when the kind does not support it.
    pub fn field_label(&self, label: &str) -> Option<Vec<&str>> {
        match label {
            "metadata.name" => Some(vec!["metadata", "name"]),
            "metadata.namespace" => Some(vec!["metadata", "namespace"]),
            _ => self
                .field_labels
                .iter()
                .find(|(l, _)| *l == label)
                .map(|(_, path)| path.to_vec()),
        }
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

/// How a view's fields map to its storage resource's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// `events.k8s.io/v1` Event over core `v1` Event.
    EventsV1,
}
