//! `PortMapClass`: the administrator's description of where ports may be opened.

// kube's printcolumn(...) repeats keys such as `type_` per column, which clippy mistakes for
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    DEFAULT_VXLAN_PORT, DEFAULT_VXLAN_SUBNET, DEFAULT_VXLAN_VNI, MAX_PORT, MAX_VNI, MIN_PORT,
    Protocol,
};

/// The cluster's shape as kuport sees it: which nodes accept traffic, on which interfaces, which
/// ports a PortMap may ask for, which namespaces may ask, and how replies return from a pod on
/// another node.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kuport.wlz.li",
    version = "v1alpha1",
    kind = "PortMapClass",
    plural = "portmapclasses",
    shortname = "pmc",
    category = "kuport",
    status = "PortMapClassStatus",
    derive = "PartialEq",
    doc = "PortMapClass is written by the cluster administrator: it names the nodes that accept \
           traffic, the interfaces they accept it on, the ports PortMaps may ask for, the \
           namespaces that may ask, and how replies return from pods on other nodes.",
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.returnPath.mode",
        description = "How replies return from a pod on another node (Vxlan or None)."
    ),
    printcolumn(
        name = "Serving",
        type_ = "string",
        json_path = ".spec.servingMode",
        description = "Single: one accepting node serves each mapping; Multi: all of them do."
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the class is usable (see the Ready condition's reason)."
    ),
    printcolumn(
        name = "Nodes",
        type_ = "string",
        json_path = ".status.nodesSummary",
        description = "Ready accepting nodes out of those the class names, then the ready ones."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PortMapClassSpec {
    /// The accepting nodes, by Node name. A name with no Node object, or whose Node is not
    /// Ready, is skipped: a removed or dead node stops accepting without editing the class, and
    /// its mappings fail over to the next accepting node.
    #[schemars(extend("minProperties" = 1))]
    pub nodes: BTreeMap<String, ClassNode>,

    /// Single (default): exactly one accepting node, the serving node, programs each mapping.
    /// Multi: every accepting node programs it, all forwarding to the same single endpoint (for
    /// routed virtual addresses).
    #[serde(default)]
    pub serving_mode: ServingMode,

    /// The window of ports a PortMap of this class may ask for, and the ports kept back.
    #[serde(default)]
    pub ports: PortWindow,

    /// Which namespaces may use this class. Empty or absent selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// How replies from a pod on another node return through the node that accepted the
    /// request.
    pub return_path: ReturnPath,
}

/// One accepting node's settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClassNode {
    /// Interface names this node's DNAT rules match on (for example enp1s0 for the public
    /// address and wt0 for the mesh address). Given per node, so nodes with different NIC names
    /// can share a class.
    #[schemars(
        length(min = 1, max = 16),
        inner(length(max = 15), pattern(r"^[A-Za-z0-9_@+-][A-Za-z0-9._@+-]{0,14}$"))
    )]
    pub interfaces: Vec<String>,
}

/// Whether one accepting node or all of them serve each mapping.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
pub enum ServingMode {
    /// Exactly one accepting node (the serving node) programs each mapping.
    #[default]
    Single,
    /// Every accepting node programs each mapping, all forwarding to the same endpoint.
    Multi,
}

/// The port window of a class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max").message("ports.min must not exceed ports.max"))]
pub struct PortWindow {
    /// Lowest port a PortMap may ask for.
    #[serde(default = "default_min_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub min: i32,

    /// Highest port a PortMap may ask for.
    #[serde(default = "default_max_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub max: i32,

    /// Ports the administrator keeps back: a PortMap whose range contains one is refused.
    #[serde(default)]
    #[schemars(length(max = 1024), inner(range(min = 1, max = 65535)))]
    pub reserved: Vec<i32>,
}

impl Default for PortWindow {
    fn default() -> Self {
        Self {
            min: default_min_port(),
            max: default_max_port(),
            reserved: Vec::new(),
        }
    }
}

fn default_min_port() -> i32 {
    MIN_PORT
}

fn default_max_port() -> i32 {
    MAX_PORT
}

/// How replies return from a pod on another node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReturnPath {
    /// Vxlan: build a VXLAN link between the accepting node and the pod's node, carrying the
    /// request and its replies. None: build no link and refuse every mapping whose pod is not on
    /// its programming node.
    pub mode: ReturnPathMode,

    /// Settings of the VXLAN links; ignored when mode is None.
    #[serde(default)]
    pub vxlan: VxlanSettings,
}

/// The return path mechanism.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
pub enum ReturnPathMode {
    /// A VXLAN link per node pair carries requests to the pod's node and replies back.
    Vxlan,
    /// No links: mappings whose pod is on another node are refused.
    None,
}

/// VXLAN link settings of a class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VxlanSettings {
    /// Base VXLAN network identifier: a link takes this plus its slot number.
    #[serde(default = "default_vni")]
    #[schemars(range(min = 1, max = 16777215))]
    pub vni: i32,

    /// UDP port of the links. Must differ from the CNI's own VXLAN port (8472 on Cilium).
    #[serde(default = "default_vxlan_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// IPv4 CIDR the link addresses come from: one /31 per node pair, so a /24 holds 128 pairs.
    /// Link-local space avoids touching any other route.
    #[serde(default = "default_subnet")]
    #[schemars(length(max = 18))]
    pub subnet: String,
}

impl Default for VxlanSettings {
    fn default() -> Self {
        Self {
            vni: default_vni(),
            port: default_vxlan_port(),
            subnet: default_subnet(),
        }
    }
}

fn default_vni() -> i32 {
    DEFAULT_VXLAN_VNI
}

fn default_vxlan_port() -> i32 {
    DEFAULT_VXLAN_PORT
}

fn default_subnet() -> String {
    DEFAULT_VXLAN_SUBNET.to_owned()
}

const _: () = assert!(DEFAULT_VXLAN_VNI <= MAX_VNI);

/// What the agents observed about the class. Shared: each accepting node writes only its own
/// row, its own link claims and its own garbage-collection marks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortMapClassStatus {
    /// The class generation the Ready condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The Ready condition: Valid, InvalidSubnet, ReturnPathOverlap, VxlanPortConflict or
    /// SubnetExhausted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// One row per accepting node, written only by that node's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub nodes: Vec<ClassNodeStatus>,

    /// The accepting nodes that accept now, sorted: named by the class, with a Ready Node
    /// object and a ready row. Recomputed by every accepting agent whenever it writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready_nodes: Vec<String>,

    /// readyNodes out of the nodes the class names, then the ready ones, for example
    /// "2/2 edge-a,edge-b" (at most four names, then "… +N"): what the Nodes column shows.
    /// Derived from readyNodes in the same write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub nodes_summary: Option<String>,

    /// Return-link address claims, one per node pair that has, or recently had, a link.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["key".into()]))]
    pub links: Vec<LinkClaim>,

    /// Mappings of this class whose nftables rules or return link a node's kernel refused in
    /// that node's last pass, with the kernel's words; each node writes its own entries. Every
    /// other mapping on that node is still programmed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedMapping>,
}

/// One accepting node's view of the class, written by that node's agent.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClassNodeStatus {
    /// The node this row describes.
    #[schemars(length(max = 253))]
    pub name: String,

    /// True when every interface the class gives this node resolves to an IPv4 address.
    pub ready: bool,

    /// Why the node is not ready, for example "interface wt0 not present".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,

    /// MTU of the interface carrying the node's InternalIP.
    #[serde(
        default,
        rename = "underlayMTU",
        skip_serializing_if = "Option::is_none"
    )]
    pub underlay_mtu: Option<i32>,

    /// MTU of this node's return links: the underlay MTU minus 50 bytes of VXLAN over IPv4.
    #[serde(default, rename = "linkMTU", skip_serializing_if = "Option::is_none")]
    pub link_mtu: Option<i32>,

    /// The IPv4 address each class interface resolved to on this node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = 16,
        "additionalProperties" = {"type": "string", "maxLength": 15}
    ))]
    pub addresses: BTreeMap<String, String>,

    /// What the agent read of the CNI's configuration; absent when none was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniInfo>,

    /// Host sockets on this node that hold a port some PortMap of the class asks for, on an
    /// address the class binds here. A mapping is refused such a port unless it was accepted
    /// before the socket appeared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_ports: Vec<HeldPort>,

    /// What this node's own firewall is known to do to mapped traffic, for example a forward
    /// chain whose policy is drop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 1024)))]
    pub warnings: Vec<String>,

    /// The kuport version of the agent that wrote this row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub agent_version: Option<String>,

    /// When this node's agent last completed a pass, refreshed at most once a minute (and at
    /// every resync, 5 minutes by default): a time much older than that means the agent stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pass_time: Option<Time>,
}

/// A port a host socket holds on an accepting node.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "camelCase")]
pub struct HeldPort {
    /// TCP or UDP.
    pub protocol: Protocol,

    /// The port.
    pub port: i32,

    /// The address the socket is bound to: `0.0.0.0` for every address of the node.
    #[schemars(length(max = 15))]
    pub address: String,

    /// What holds it, for example "host TCP listener 0.0.0.0:22".
    #[schemars(length(max = 256))]
    pub holder: String,

    /// Mappings (`namespace/name`) this node was already forwarding the port for when it first
    /// saw the socket: they keep the port (earliest wins); any other mapping is refused it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub yields_to: Vec<String>,
}

/// A mapping of the class a node's kernel refused, as that node reported it.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "camelCase")]
pub struct RefusedMapping {
    /// The node whose kernel refused (it owns this entry).
    #[schemars(length(max = 253))]
    pub node: String,

    /// The mapping, `namespace/name`.
    #[schemars(length(max = 317))]
    pub mapping: String,

    /// What was refused (its nftables rules, or the return link it uses) and what the kernel
    /// said.
    #[schemars(length(max = 1024))]
    pub message: String,
}

/// The CNI facts an agent read (from kube-system/cilium-config).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CniInfo {
    /// The CNI's name, for example cilium.
    #[schemars(length(max = 63))]
    pub name: String,

    /// The CNI's routing mode as configured (tunnel or native), when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub routing_mode: Option<String>,

    /// The UDP port of the CNI's own VXLAN overlay; kuport's link port must differ from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan_port: Option<i32>,
}

/// A recorded claim on one /31 of the class subnet for the return link of one node pair.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LinkClaim {
    /// The two node names, sorted and joined by "/".
    #[schemars(length(max = 507))]
    pub key: String,

    /// The two node names, sorted.
    #[serde(default)]
    #[schemars(length(max = 2), inner(length(max = 253)))]
    pub peers: Vec<String>,

    /// The claimed /31, as text.
    #[serde(default)]
    #[schemars(length(max = 18))]
    pub subnet: String,

    /// Zero-based index of the /31 inside the class subnet. Never renumbered while in use.
    pub slot: i32,

    /// Set while no PortMap needs the pair; the claim is dropped after 24 hours unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unused_since: Option<Time>,
}
