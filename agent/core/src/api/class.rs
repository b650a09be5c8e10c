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
    DEFAULT_VXLAN_PORT, DEFAULT_VXLAN_SUBNET, DEFAULT_VXLAN_SUBNET6, DEFAULT_VXLAN_VNI, MAX_PORT,
    MAX_VNI, MIN_PORT, Protocol,
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

    /// IPv4 CIDRs pods of the cluster have addresses in, besides the Nodes' spec.podCIDRs and
    /// the cluster pool Cilium's ConfigMap names. An endpoint outside every pod network is
    /// never used; set this where the CNI assigns pod addresses Kubernetes does not see (Calico
    /// IPAM, Cilium multi-pool, cloud VPC CNIs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(max = 18), pattern(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$"))
    )]
    pub pod_networks: Vec<String>,

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

    /// Ports kept back for the nodes' own services, refused like reserved ones. The default is
    /// the Kubernetes NodePort range 30000-32767 (set the cluster's own if the API server's
    /// --service-node-port-range differs) and well-known node service ports: 22 ssh, 179 BGP,
    /// 2379-2380 etcd, 4240 and 4244 Cilium, 5473 Calico Typha, 6443 the API server,
    /// 10249-10259 kubelet, kube-proxy, controller-manager and scheduler, 50000-50001 Talos.
    /// A shorter list (or []) opts in to the ports it leaves out; a port a host socket,
    /// NodePort or hostPort holds stays refused.
    #[serde(default = "default_system_reserved")]
    #[schemars(length(max = 1024))]
    pub system_reserved: Vec<PortSpan>,

    /// How many ports the PortMaps of one namespace may hold in this class, TCP and UDP
    /// counted apart (a range of 100 UDP ports counts 100), as `services.nodeports` in a
    /// ResourceQuota counts NodePorts. A PortMap that would take its namespace past it is
    /// refused (`PortQuotaExceeded`) and holds nothing; mappings are counted in conflict order
    /// (oldest first), so lowering the quota refuses the newest first. 0 lets a namespace hold
    /// nothing unless `namespaceQuotas` names it.
    #[serde(default = "default_per_namespace")]
    #[schemars(range(min = 0, max = 131072))]
    pub per_namespace: i32,

    /// The quota of a named namespace, in place of `perNamespace`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 1024))]
    pub namespace_quotas: BTreeMap<String, i32>,
}

/// The default `ports.perNamespace`: enough for any one game, mail or DNS deployment's ports
/// and a range of a thousand, a small share of a class window.
pub const DEFAULT_PORTS_PER_NAMESPACE: i32 = 1024;

fn default_per_namespace() -> i32 {
    DEFAULT_PORTS_PER_NAMESPACE
}

impl PortWindow {
    /// The quota of `namespace`, in ports (negative values count as 0).
    pub fn quota_of(&self, namespace: &str) -> u32 {
        let quota = self
            .namespace_quotas
            .get(namespace)
            .copied()
            .unwrap_or(self.per_namespace);
        u32::try_from(quota).unwrap_or(0)
    }
}

impl Default for PortWindow {
    fn default() -> Self {
        Self {
            min: default_min_port(),
            max: default_max_port(),
            reserved: Vec::new(),
            system_reserved: default_system_reserved(),
            per_namespace: default_per_namespace(),
            namespace_quotas: BTreeMap::new(),
        }
    }
}

/// A port, or an inclusive range of ports.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.endPort) || self.endPort >= self.port").message("endPort must not be lower than port"))]
pub struct PortSpan {
    /// The port, or the first port of the range.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Last port of the range; absent for a single port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub end_port: Option<i32>,
}

impl PortSpan {
    /// A single port.
    pub const fn one(port: i32) -> Self {
        Self {
            port,
            end_port: None,
        }
    }

    /// An inclusive range.
    pub const fn range(port: i32, end_port: i32) -> Self {
        Self {
            port,
            end_port: Some(end_port),
        }
    }

    /// The last port (the port itself when no range is given).
    pub fn last(&self) -> i32 {
        self.end_port.unwrap_or(self.port)
    }
}

impl std::fmt::Display for PortSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.end_port {
            Some(end) if end != self.port => write!(f, "{}-{end}", self.port),
            _ => write!(f, "{}", self.port),
        }
    }
}

/// The default `ports.systemReserved`: ports the nodes' own services use (see the field).
pub const DEFAULT_SYSTEM_RESERVED: &[PortSpan] = &[
    PortSpan::one(22),
    PortSpan::one(179),
    PortSpan::range(2379, 2380),
    PortSpan::one(4240),
    PortSpan::one(4244),
    PortSpan::one(5473),
    PortSpan::one(6443),
    PortSpan::range(10249, 10259),
    PortSpan::range(30000, 32767),
    PortSpan::range(50000, 50001),
];

fn default_system_reserved() -> Vec<PortSpan> {
    DEFAULT_SYSTEM_RESERVED.to_vec()
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

    /// IPv6 prefix (at most /96) the links' inner IPv6 addresses come from: each end's IPv6
    /// address is this prefix with its IPv4 link address as the low 32 bits, so classes with
    /// distinct IPv4 subnets never share an IPv6 link address. Used only by links that carry
    /// IPv6 mappings.
    #[serde(default = "default_subnet6", rename = "ipv6Subnet")]
    #[schemars(length(max = 43))]
    pub subnet6: String,
}

impl Default for VxlanSettings {
    fn default() -> Self {
        Self {
            vni: default_vni(),
            port: default_vxlan_port(),
            subnet: default_subnet(),
            subnet6: default_subnet6(),
        }
    }
}

fn default_subnet6() -> String {
    DEFAULT_VXLAN_SUBNET6.to_owned()
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

/// The ports one namespace holds in a class, and its quota.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct NamespacePorts {
    /// The namespace.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// Ports its accepted PortMaps hold (TCP and UDP counted apart).
    pub used_ports: i64,
    /// Ports it may hold.
    pub quota_ports: i64,
}

/// What the agents observed about the class. Shared: each node writes only its own
/// row, its own link claims and its own garbage-collection marks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortMapClassStatus {
    /// The class generation the Ready condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The Ready condition: Valid, InvalidSubnet, ReturnPathOverlap, VxlanPortConflict,
    /// SubnetExhausted or PreflightExpired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// One row per accepting node, and per pod's node holding an end of one of the class's
    /// return links, each written only by that node's agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub nodes: Vec<ClassNodeStatus>,

    /// The accepting nodes that accept now, sorted: named by the class, with a Ready Node
    /// object and a ready row. Recomputed by every accepting agent whenever it writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready_nodes: Vec<String>,

    /// The ports each namespace's accepted PortMaps hold in this class, against its quota
    /// (`spec.ports.perNamespace` or `namespaceQuotas`), by namespace name; only namespaces
    /// holding ports, at most 256 (those holding the most). Recomputed by every accepting
    /// agent whenever it writes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["namespace".into()]))]
    pub namespaces: Vec<NamespacePorts>,

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

    /// True when at least one interface the class gives this node resolves to an IPv4 address
    /// (the node serves on those; `message` names the others).
    pub ready: bool,

    /// Why the node is not ready, or which of its interfaces it does not serve on, for example
    /// "interface wt0 not present; serving on eth0 only".
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

    /// The IPv6 address a client can reach each class interface at on this node, for those that
    /// have one (IPv6 mappings are published there).
    #[serde(
        default,
        rename = "ipv6Addresses",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(extend(
        "maxProperties" = 16,
        "additionalProperties" = {"type": "string", "maxLength": 45}
    ))]
    pub addresses6: BTreeMap<String, String>,

    /// This node's addresses on a network segment (either family; not host-length prefixes
    /// such as IPVS ClusterIPs, nor loopback, link-local or a return link's), sorted, at most 16
    /// of each family: listed by a node holding return-link ends, so the
    /// accepting node at the other end of a link recognises this node (or a pod it
    /// masquerades) dialling a published address from any of them, over the mesh, a LAN or
    /// a public segment. Used only for flows to this node's own endpoints in this class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 45)))]
    pub host_addresses: Vec<String>,

    /// What the agent read of the CNI's configuration; absent when none was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniInfo>,

    /// What on this node holds a port some PortMap of the class asks for, on an address the
    /// class binds here: host sockets, NodePorts, hostPorts of its Pods, and the claims of such
    /// holders that are gone. Only PortMaps the class selects and whose ports lie in its window
    /// count; at most 256 entries (a warning counts those left out). A mapping is refused such a port unless the node was already
    /// forwarding it for that mapping when the holder appeared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
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

    /// This node's end of each return link of the class it holds, by peer: what its last apply
    /// built (its acknowledgement of the link) and what its probes across the link found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8192))]
    pub links: Vec<LinkEndStatus>,

    /// False for a node the class does not name that writes a row only for its ends of return
    /// links (a pod's node); absent (true) for an accepting node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepting: Option<bool>,

    /// What this node's agent found of the host settings and CNI configuration kuport depends
    /// on (ip_forward, rp_filter, src_valid_mark, the InternalIP's device, the CNI's overlay
    /// port and host routing), sorted by name: passed, failed, or not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub checks: Vec<NodeCheck>,
}

/// One check of a node's host or CNI configuration, as its agent found it.
#[derive(
    KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct NodeCheck {
    /// What is checked, for example ipForward, ipv6Forward, rpFilter, srcValidMark, internalIP,
    /// cniOverlayPort or cniHostRouting.
    #[schemars(length(max = 63))]
    pub name: String,

    /// True when the check passed, false when it failed; absent when it could not be checked
    /// (the message says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,

    /// What was found, for example "net.ipv4.ip_forward is 0".
    #[schemars(length(max = 512))]
    pub message: String,
}

/// One node's end of one return link, written by that node's agent: its acknowledgement that
/// the link is built (at `slot`), and its probes' verdict on the path across it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LinkEndStatus {
    /// The node at the other end.
    #[schemars(length(max = 253))]
    pub peer: String,

    /// The claim slot this node built the link at: an acknowledgement of another slot is out
    /// of date.
    pub slot: i32,

    /// What the probes across the link found: true when the peer answers (full-size probes
    /// included), false when it stopped answering; absent until the first verdict, or when
    /// the agent does not probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,

    /// When `up` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,

    /// The median round trip of the last probes, in microseconds (refreshed at most once a
    /// minute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_microseconds: Option<i32>,

    /// The largest probe (IP packet bytes) that crossed the link and came back: the link's MTU
    /// once verified.
    #[serde(
        default,
        rename = "verifiedMTU",
        skip_serializing_if = "Option::is_none"
    )]
    pub verified_mtu: Option<i32>,

    /// What failed, when `up` is false: which check, to which address, since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub message: Option<String>,
}

/// A port something on an accepting node holds: a host socket, a NodePort or a hostPort. Once
/// reported, the claim outlives its holder: it stays (with `absentSince`) until the
/// administrator releases it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct HeldPort {
    /// TCP or UDP.
    pub protocol: Protocol,

    /// The port.
    pub port: i32,

    /// The address it is held on: `0.0.0.0` for every address of the node.
    #[schemars(length(max = 15))]
    pub address: String,

    /// What holds it, for example "host TCP listener 0.0.0.0:22", "NodePort of Service
    /// shop/web" or "hostPort of Pod ingress/nginx-0"; the last holder seen while it is absent.
    #[schemars(length(max = 256))]
    pub holder: String,

    /// Mappings (`namespace/name`) this node was already forwarding the port for when it first
    /// saw the holder: they keep the port (earliest wins); any other mapping is refused it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub yields_to: Vec<String>,

    /// Set while the holder is gone (a restarting daemon, a deleted Pod or Service): the claim
    /// stays, so no mapping takes the port meanwhile, until the administrator releases it with
    /// the class annotation kuport.wlz.li/release-held-ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent_since: Option<Time>,
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
