//! `PortMap`: a workload's request for a port on the accepting nodes of a class.

// kube's printcolumn(...) repeats keys such as `type_` per column, which clippy mistakes for
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A TCP or UDP port (or inclusive range) on the accepting nodes of a class, delivered to the
/// pod behind a Service in the same namespace with the client's own source address intact.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "kuport.wlz.li",
    version = "v1alpha1",
    kind = "PortMap",
    plural = "portmaps",
    namespaced,
    shortname = "pm",
    category = "kuport",
    status = "PortMapStatus",
    derive = "PartialEq",
    doc = "PortMap is written by a workload in its own namespace: it asks for a TCP or UDP port \
           (or range) on the accepting nodes of a PortMapClass, delivered to the pod behind a \
           named Service port with the client's own source address intact.",
    printcolumn(
        name = "Class",
        type_ = "string",
        json_path = ".spec.className",
        description = "The PortMapClass asked for."
    ),
    printcolumn(
        name = "Proto",
        type_ = "string",
        json_path = ".spec.protocol",
        description = "TCP or UDP."
    ),
    printcolumn(
        name = "Port",
        type_ = "integer",
        json_path = ".spec.port",
        description = "The port clients dial."
    ),
    printcolumn(
        name = "End",
        type_ = "integer",
        json_path = ".spec.endPort",
        description = "Last port of the range, when a range was asked for."
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".status.endpoint.address",
        description = "Address of the pod the mapping delivers to."
    ),
    printcolumn(
        name = "Programmed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Programmed\")].status",
        description = "Whether the port answers (see the Programmed condition's reason)."
    ),
    printcolumn(
        name = "Published",
        type_ = "string",
        json_path = ".status.publishedSummary",
        description = "Addresses the port answers on (at most four, then a count of the rest)."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.endpoint.node",
        priority = 1,
        description = "The node the endpoint pod runs on."
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Programmed\")].reason",
        priority = 1,
        description = "The Programmed condition's reason: why the port answers or does not."
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.endPort) || self.endPort >= self.port")
        .message("endPort must not be lower than port"),
    validation = Rule::new("has(self.endPort) == has(oldSelf.endPort) && (!has(self.endPort) || self.endPort == oldSelf.endPort)")
        .message("endPort is immutable: delete the PortMap and create another"),
)]
pub struct PortMapSpec {
    /// Name of the PortMapClass asked for. Immutable.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("className is immutable: delete the PortMap and create another"))]
    pub class_name: String,

    /// TCP or UDP. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("protocol is immutable: delete the PortMap and create another"))]
    pub protocol: Protocol,

    /// The port clients dial on the accepting node (the first port of a range). A single port is
    /// delivered to the pod port the Service's named port lists; a range is delivered port for
    /// port. Immutable.
    #[schemars(range(min = 1, max = 65535))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("port is immutable: delete the PortMap and create another"))]
    pub port: i32,

    /// Last port of an inclusive range; absent for a single port. Immutable together with port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub end_port: Option<i32>,

    /// Narrows, per node, the interfaces the class gives; empty or absent means all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(max = 15), pattern(r"^[A-Za-z0-9_@+-][A-Za-z0-9._@+-]{0,14}$"))
    )]
    pub interfaces: Vec<String>,

    /// The Service (in this PortMap's namespace) and its named port whose endpoints receive the
    /// traffic.
    pub service_ref: ServiceRef,
}

/// Transport protocol of a mapping.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum Protocol {
    /// TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    /// As the API writes it: `TCP`, `UDP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }

    /// As nft and `ss` write it: `tcp`, `udp`.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A named port of a Service in the PortMap's own namespace (there is deliberately no namespace
/// field: a mapping cannot point at another namespace's workload).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRef {
    /// Name of the Service.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// Name of the Service port; its EndpointSlice entries are the candidate endpoints.
    #[schemars(length(min = 1, max = 63))]
    pub port: String,
}

/// What kuport observed and decided about the mapping, written by one agent: the mapping's
/// status writer.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortMapStatus {
    /// The PortMap generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The pod the mapping delivers to; absent when no ready endpoint exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointStatus>,

    /// Where the port answers once Programmed is True: one row per programming node and
    /// interface it binds, sorted by node then interface.
    // Shared, not copied: the plan gives every mapping of one group the same rows.
    #[serde(default, skip_serializing_if = "published_is_empty")]
    pub published: std::sync::Arc<[PublishedAddress]>,

    /// The published addresses joined by commas, each once, at most four and then "… +N" for
    /// the rest ("?" for an address not resolved yet): what the Published column shows. Derived
    /// from published by the same writer in the same write; absent when nothing is published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub published_summary: Option<String>,

    /// Accepted (the request is valid and holds its ports) and Programmed (the port answers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The endpoint chosen for a mapping.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// The node the pod runs on.
    #[schemars(length(max = 253))]
    pub node: String,

    /// The pod's address: IPv4 when the Service lists IPv4 endpoints, else IPv6.
    #[schemars(length(max = 45))]
    pub address: String,

    /// The same pod's IPv6 address, when the Service is dual-stack: the mapping is served over
    /// IPv6 too.
    #[serde(
        default,
        rename = "ipv6Address",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 45))]
    pub address6: Option<String>,

    /// The pod's port: the number the EndpointSlice lists for the named Service port.
    pub port: i32,

    /// The pod's name, when the EndpointSlice names it (its targetRef).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub pod: Option<String>,
}

/// One place a mapping answers.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct PublishedAddress {
    /// The programming node.
    #[schemars(length(max = 253))]
    pub node: String,

    /// The interface of that node the mapping binds.
    #[schemars(length(max = 15))]
    pub interface: String,

    /// The interface's IPv4 address; empty until the node's agent has resolved it.
    #[serde(default)]
    #[schemars(length(max = 15))]
    pub address: String,

    /// The interface's IPv6 address, when the mapping is served over IPv6 and the interface
    /// has one a client can reach.
    #[serde(
        default,
        rename = "ipv6Address",
        skip_serializing_if = "String::is_empty"
    )]
    #[schemars(length(max = 45))]
    pub address6: String,
}

fn published_is_empty(rows: &std::sync::Arc<[PublishedAddress]>) -> bool {
    rows.is_empty()
}
