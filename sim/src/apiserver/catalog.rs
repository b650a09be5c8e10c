//! The catalog of resources the model serves: built-in Kubernetes kinds described here, and the
//! kuport kinds read from the generated CRDs (`kuport_core::crd::crd_files()`), never from a
//! copy.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::error::BuildError;
use super::jsonpath::JsonPath;
use super::resource::{Column, Conversion, Custom, Resource};

struct BuiltIn {
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status_subresource: bool,
    keep_status_on_create: bool,
    field_labels: &'static [(&'static str, &'static [&'static str])],
    default_field_conversion: bool,
    /// (name, type, JSONPath, priority)
    columns: &'static [(&'static str, &'static str, &'static str, i32)],
}

const AGE: (&str, &str, &str, i32) = ("Age", "date", ".metadata.creationTimestamp", 0);

const EVENT_FIELDS: &[(&str, &[&str])] = &[
    ("involvedObject.kind", &["involvedObject", "kind"]),
    ("involvedObject.namespace", &["involvedObject", "namespace"]),
    ("involvedObject.name", &["involvedObject", "name"]),
    ("involvedObject.uid", &["involvedObject", "uid"]),
    (
        "involvedObject.apiVersion",
        &["involvedObject", "apiVersion"],
    ),
    (
        "involvedObject.resourceVersion",
        &["involvedObject", "resourceVersion"],
    ),
    ("involvedObject.fieldPath", &["involvedObject", "fieldPath"]),
    ("reason", &["reason"]),
    ("reportingComponent", &["reportingComponent"]),
    ("source", &["source", "component"]),
    ("type", &["type"]),
];

const EVENTS_K8S_IO_FIELDS: &[(&str, &[&str])] = &[
    ("regarding.kind", &["regarding", "kind"]),
    ("regarding.namespace", &["regarding", "namespace"]),
    ("regarding.name", &["regarding", "name"]),
    ("regarding.uid", &["regarding", "uid"]),
    ("regarding.apiVersion", &["regarding", "apiVersion"]),
    (
        "regarding.resourceVersion",
        &["regarding", "resourceVersion"],
    ),
    ("regarding.fieldPath", &["regarding", "fieldPath"]),
    ("reason", &["reason"]),
    ("reportingController", &["reportingController"]),
    ("type", &["type"]),
];

const BUILT_INS: &[BuiltIn] = &[
    BuiltIn {
        group: "",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        status_subresource: true,
        keep_status_on_create: false,
        field_labels: &[("status.phase", &["status", "phase"])],
        default_field_conversion: false,
        columns: &[("Status", "string", ".status.phase", 0), AGE],
    },
    BuiltIn {
        group: "",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        status_subresource: true,
        keep_status_on_create: true,
        field_labels: &[("spec.unschedulable", &["spec", "unschedulable"])],
        default_field_conversion: false,
        columns: &[
            AGE,
            (
                "Internal-IP",
                "string",
                ".status.addresses[?(@.type==\"InternalIP\")].address",
                1,
            ),
        ],
    },
    BuiltIn {
        group: "",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        status_subresource: true,
        keep_status_on_create: false,
        field_labels: &[
            ("spec.clusterIP", &["spec", "clusterIP"]),
            ("spec.type", &["spec", "type"]),
        ],
        default_field_conversion: false,
        columns: &[
            ("Type", "string", ".spec.type", 0),
            ("Cluster-IP", "string", ".spec.clusterIP", 0),
            AGE,
        ],
    },
    BuiltIn {
        group: "",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        status_subresource: false,
        keep_status_on_create: true,
        field_labels: &[],
        default_field_conversion: true,
        columns: &[AGE],
    },
    BuiltIn {
        group: "",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        status_subresource: false,
        keep_status_on_create: true,
        field_labels: EVENT_FIELDS,
        default_field_conversion: false,
        columns: &[
            ("Type", "string", ".type", 0),
            ("Reason", "string", ".reason", 0),
            ("Object", "string", ".involvedObject.name", 0),
            ("Message", "string", ".message", 0),
            AGE,
        ],
    },
    // The agent reads its own Pod and the DaemonSet owning it when it stops (an uninstall
    // removes the datapath, an update keeps it). The model stores them; it runs no controller.
    BuiltIn {
        group: "",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        status_subresource: true,
        keep_status_on_create: true,
        field_labels: &[("spec.nodeName", &["spec", "nodeName"])],
        default_field_conversion: false,
        columns: &[("Status", "string", ".status.phase", 0), AGE],
    },
    BuiltIn {
        group: "apps",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        short_names: &["ds"],
        status_subresource: true,
        keep_status_on_create: false,
        field_labels: &[],
        default_field_conversion: true,
        columns: &[AGE],
    },
    BuiltIn {
        group: "discovery.k8s.io",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        short_names: &[],
        status_subresource: false,
        keep_status_on_create: true,
        field_labels: &[],
        default_field_conversion: true,
        columns: &[("AddressType", "string", ".addressType", 0), AGE],
    },
    // The kubelet's heartbeat (KEP-589): the scale harness renews one per node as kubelets do.
    BuiltIn {
        group: "coordination.k8s.io",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        status_subresource: false,
        keep_status_on_create: true,
        field_labels: &[],
        default_field_conversion: true,
        columns: &[("Holder", "string", ".spec.holderIdentity", 0), AGE],
    },
    BuiltIn {
        group: "events.k8s.io",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &[],
        status_subresource: false,
        keep_status_on_create: true,
        field_labels: EVENTS_K8S_IO_FIELDS,
        default_field_conversion: false,
        columns: &[
            ("Type", "string", ".type", 0),
            ("Reason", "string", ".reason", 0),
            ("Object", "string", ".regarding.name", 0),
            ("Note", "string", ".note", 0),
            AGE,
        ],
    },
];

fn built_in(b: &BuiltIn) -> Result<Resource, BuildError> {
    let columns = b
        .columns
        .iter()
        .map(|(name, ty, path, priority)| {
            Ok(Column {
                name: (*name).to_owned(),
                type_: (*ty).to_owned(),
                format: String::new(),
                description: String::new(),
                priority: *priority,
                path: JsonPath::parse(path).map_err(|what| BuildError::Column {
                    crd: format!("built-in {}", b.plural),
                    column: (*name).to_owned(),
                    what,
                })?,
            })
        })
        .collect::<Result<_, BuildError>>()?;
    Ok(Resource {
        group: b.group.to_owned(),
        version: "v1".to_owned(),
        plural: b.plural.to_owned(),
        singular: b.singular.to_owned(),
        kind: b.kind.to_owned(),
        namespaced: b.namespaced,
        short_names: b.short_names.iter().map(|s| (*s).to_owned()).collect(),
        categories: Vec::new(),
        status_subresource: b.status_subresource,
        keep_status_on_create: b.keep_status_on_create,
        field_labels: b.field_labels.to_vec(),
        default_field_conversion: b.default_field_conversion,
        columns,
        custom: None,
        stored_as: None,
        conversion: None,
    })
}

/// Reads a CRD's served version into a resource: names, scope, subresources, printer columns and
/// the schema. Fails (rather than guessing) when the CRD lacks a schema or a column's JSONPath is
/// outside the evaluated subset.
pub fn from_crd(crd: &CustomResourceDefinition) -> Result<Resource, BuildError> {
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    let fail = |what: &str| BuildError::Crd {
        crd: crd_name.clone(),
        what: what.to_owned(),
    };
    let version = crd
        .spec
        .versions
        .iter()
        .find(|v| v.served && v.storage)
        .ok_or_else(|| fail("no version is both served and stored"))?;
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .ok_or_else(|| fail("the stored version has no openAPIV3Schema"))?;
    let schema = serde_json::to_value(schema)
        .map_err(|e| fail(&format!("schema does not serialise: {e}")))?;
    let mut columns = Vec::new();
    for col in version.additional_printer_columns.iter().flatten() {
        columns.push(Column {
            name: col.name.clone(),
            type_: col.type_.clone(),
            format: col.format.clone().unwrap_or_default(),
            description: col.description.clone().unwrap_or_default(),
            priority: col.priority.unwrap_or(0),
            path: JsonPath::parse(&col.json_path).map_err(|what| BuildError::Column {
                crd: crd_name.clone(),
                column: col.name.clone(),
                what,
            })?,
        });
    }
    if version.additional_printer_columns.is_none() {
        // The real server's default for a CRD without columns is a single Age column.
        columns.push(Column {
            name: "Age".to_owned(),
            type_: "date".to_owned(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            path: JsonPath::parse(".metadata.creationTimestamp")
                .map_err(|what| fail(&format!("default Age column: {what}")))?,
        });
    }
    let names = &crd.spec.names;
    Ok(Resource {
        group: crd.spec.group.clone(),
        version: version.name.clone(),
        plural: names.plural.clone(),
        singular: names
            .singular
            .clone()
            .unwrap_or_else(|| names.kind.to_lowercase()),
        kind: names.kind.clone(),
        namespaced: crd.spec.scope == "Namespaced",
        short_names: names.short_names.clone().unwrap_or_default(),
        categories: names.categories.clone().unwrap_or_default(),
        status_subresource: version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some()),
        keep_status_on_create: false,
        field_labels: Vec::new(),
        default_field_conversion: false,
        columns,
        custom: Some(Custom { crd_name, schema }),
        stored_as: None,
        conversion: None,
    })
}

/// Every served resource, in a fixed order (built-ins, then the CRDs sorted by file name).
pub fn all_resources() -> Result<Vec<Resource>, BuildError> {
    let mut out = BUILT_INS
        .iter()
        .map(built_in)
        .collect::<Result<Vec<_>, _>>()?;
    for file in kuport_core::crd::crd_files() {
        out.push(from_crd(&file.crd)?);
    }
    // One Event store, two groups, as on the real server.
    let core_events = out
        .iter()
        .position(|r| r.group.is_empty() && r.plural == "events");
    if let Some(core) = core_events {
        for r in out
            .iter_mut()
            .filter(|r| r.group == "events.k8s.io" && r.plural == "events")
        {
            r.stored_as = Some(core);
            r.conversion = Some(Conversion::EventsV1);
        }
    }
    Ok(out)
}
