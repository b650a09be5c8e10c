//! The plan's inputs: the cluster objects every agent sees alike, and the facts only this node
//! can read.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::{Deserialize, Serialize};

use crate::api::{NodeCheck, PortMap, PortMapClass, PortMapNode, Protocol, conditions};
use crate::ir::{MarkLayout, ProgrammedPort};

/// The CNI's VXLAN port when `cilium-config` exists without a `tunnel-port` key.
pub const CILIUM_DEFAULT_VXLAN_PORT: u16 = 8472;
/// Namespace and name of the ConfigMap the CNI facts are read from.
pub const CILIUM_CONFIG: (&str, &str) = ("kube-system", "cilium-config");
/// The keys of `cilium-config` [`CniFacts::from_cilium_config`] reads (the agent keeps no
/// other).
pub const CILIUM_CONFIG_KEYS: [&str; 7] = [
    "cluster-pool-ipv4-cidr",
    "enable-bpf-masquerade",
    "enable-host-legacy-routing",
    "ipam",
    "routing-mode",
    "tunnel",
    "tunnel-port",
];

/// Cilium's annotations naming the address of a node's `cilium_host` device (current and
/// older spelling); Cilium writes them when it annotates Nodes. The only annotations of a Node
/// the plan reads.
pub const CILIUM_HOST_ANNOTATIONS: [&str; 2] = [
    "network.cilium.io/ipv4-cilium-host",
    "io.cilium.network.ipv4-cilium-host",
];

/// Everything the plan reads from the API server. Order of the lists does not matter: the plan
/// sorts whatever it iterates.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every PortMapClass, with its status (link claims, and rows of nodes whose agents predate
    /// `PortMapNode`).
    pub classes: Vec<PortMapClass>,
    /// Every PortMapNode: each node's rows of the classes (`plan::node_rows`).
    pub portmap_nodes: Vec<PortMapNode>,
    /// Every PortMap.
    pub portmaps: Vec<PortMap>,
    /// The EndpointSlices (discovery.k8s.io/v1). The plan reads only those of a Service some
    /// PortMap refers to, and the agent keeps no other.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Every Node.
    pub nodes: Vec<Node>,
    /// Every Namespace.
    pub namespaces: Vec<Namespace>,
    /// Every Service: their NodePorts are held on every node. The agent keeps only what the
    /// plan reads of them (type and ports).
    pub services: Vec<Service>,
    /// Whether `services` is every Service of the cluster (the agent's watch), so that a
    /// PortMap naming a Service found neither there nor in a slice is `ServiceNotFound`. An
    /// offline dump that left Services out says nothing of them (`kuport plan` sets this when
    /// its input holds any Service: every cluster has `default/kubernetes`).
    pub services_listed: bool,
    /// Pods, for their hostPorts and addresses: the agent watches only its own node's, the
    /// plan reads only those bound to the node it plans for.
    pub pods: Vec<Pod>,
    /// Whether `pods` holds every Pod bound to the node planned for (the agent's watch): then
    /// that node delivers only to endpoints at an address of one of them (an EndpointSlice's
    /// `nodeName` is the tenant's word; a Pod's binding and addresses are the scheduler's and
    /// the kubelet's). An offline dump without Pods says nothing of them.
    pub pods_listed: bool,
    /// What `kube-system/cilium-config` says, when it exists.
    pub cni: Option<CniFacts>,
}

/// The CNI facts read from `kube-system/cilium-config`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniFacts {
    /// The CNI's name (`cilium`).
    pub name: String,
    /// `routing-mode` (or the older `tunnel` key), as written.
    pub routing_mode: Option<String>,
    /// The CNI's own VXLAN port (`tunnel-port`, 8472 when absent or unparsable).
    pub vxlan_port: u16,
    /// The pod address pool of Cilium's cluster-pool IPAM (`cluster-pool-ipv4-cidr`, as
    /// written), when that is the IPAM mode: pods get addresses there that no Node's
    /// `spec.podCIDRs` lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
    /// `enable-host-legacy-routing`, when it is `true` or `false`: false asks for BPF host
    /// routing, whose pod traffic bypasses the host's netfilter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_legacy_routing: Option<bool>,
    /// `enable-bpf-masquerade`, when it is `true` or `false`: Cilium uses BPF host routing by
    /// default only with BPF masquerading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_masquerade: Option<bool>,
}

impl CniFacts {
    /// Reads the facts from Cilium's ConfigMap.
    pub fn from_cilium_config(config: &ConfigMap) -> Self {
        let data = config.data.as_ref();
        let get = |key: &str| data.and_then(|d| d.get(key)).map(|v| v.trim().to_owned());
        let routing_mode = get("routing-mode").or_else(|| {
            // Older Cilium: `tunnel: vxlan|geneve|disabled`.
            get("tunnel").map(|t| {
                if t == "disabled" {
                    "native".to_owned()
                } else {
                    "tunnel".to_owned()
                }
            })
        });
        let vxlan_port = get("tunnel-port")
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|p| *p != 0)
            .unwrap_or(CILIUM_DEFAULT_VXLAN_PORT);
        // Cilium's default IPAM is cluster-pool; other modes (kubernetes: the Nodes' podCIDRs,
        // multi-pool, cloud ENI) do not take addresses from this key.
        let cluster_pool =
            get("ipam").is_none_or(|m| m.is_empty() || m.starts_with("cluster-pool"));
        let mut pod_cidrs: Vec<String> = match get("cluster-pool-ipv4-cidr") {
            Some(list) if cluster_pool => list
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        pod_cidrs.sort();
        pod_cidrs.dedup();
        let flag = |key: &str| match get(key).as_deref() {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        };
        Self {
            name: "cilium".to_owned(),
            routing_mode,
            vxlan_port,
            pod_cidrs,
            host_legacy_routing: flag("enable-host-legacy-routing"),
            bpf_masquerade: flag("enable-bpf-masquerade"),
        }
    }
}

/// What only this node can read from its own host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostFacts {
    /// The IPv4 address of each interface that resolved (interfaces the classes give this node).
    #[serde(default)]
    pub interfaces: BTreeMap<String, Ipv4Addr>,
    /// The IPv6 address a client can reach each such interface at (not link-local; the first
    /// the kernel lists), for those that have one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub interfaces6: BTreeMap<String, Ipv6Addr>,
    /// The device carrying this node's InternalIP (return links are bound to it).
    #[serde(default)]
    pub underlay_device: Option<String>,
    /// That device's MTU.
    #[serde(default, rename = "underlayMTU")]
    pub underlay_mtu: Option<u32>,
    /// The mark bits this agent was told to use (`--mark-base`, `--mark-mask`).
    #[serde(default)]
    pub marks: MarkLayout,
    /// The link id each kuport link already on the host carries (read back from its routing
    /// table), so a link keeps its mark, and its flows their way back, across passes and agent
    /// restarts.
    #[serde(default)]
    pub link_ids: BTreeMap<String, u32>,
    /// Sockets on this host that take traffic from outside it: TCP listeners and unconnected
    /// UDP sockets, IPv4 or dual-stack. A mapping on their port would capture their traffic.
    #[serde(default)]
    pub sockets: Vec<HostSocket>,
    /// What the host's own firewall is known to do to mapped traffic, one sentence each (for
    /// example a forward chain whose policy is drop).
    #[serde(default)]
    pub firewall_warnings: Vec<String>,
    /// Every address on this host, either family, sorted: an endpoint at one of them is never
    /// delivered to (the CNI's gateway address lies inside the node's pod CIDR).
    #[serde(default)]
    pub local_addresses: Vec<IpAddr>,
    /// The addresses of this host on a network segment (a prefix shorter than a host's: not
    /// kube-proxy's IPVS ClusterIPs, a VIP or the CNI's /32 gateway), sorted: what a client on
    /// this host dials another node from, listed in its rows as `hostAddresses`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segment_addresses: Vec<IpAddr>,
    /// The ports this node captured as an accepting node in the datapath it last applied, by
    /// mapping. A host socket first seen on one of them yields to that mapping (earliest wins).
    #[serde(default)]
    pub programmed_ports: Vec<ProgrammedPort>,
    /// Mappings whose rules or return link the kernel refused in this node's last apply, with
    /// the kernel's words. Reported in the node's class rows, so whoever writes the mapping's
    /// status says why it is not programmed.
    #[serde(default)]
    pub refusals: Vec<KernelRefusal>,
    /// What this node's probes across its return links found, sorted by class then peer: a
    /// link its probes found down makes every mapping that needs it not `Programmed`. Empty when
    /// the agent does not probe (then only the acknowledgements gate).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_probes: Vec<LinkProbe>,
    /// What this host's settings kuport depends on are (ip_forward, rp_filter of kuport's
    /// links, src_valid_mark of the capturing interfaces, the InternalIP's device), sorted by
    /// name: reported in every class row this node writes. Empty when the host does not check
    /// (the simulator).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_checks: Vec<NodeCheck>,
}

/// One return link as this node's probes across it found it: the host fact behind this node's
/// [`crate::api::LinkEndStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkProbe {
    /// The link's class.
    pub class: String,
    /// The node at the other end.
    pub peer: String,
    /// The verdict: `None` until the first one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
    /// When the verdict last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<k8s_openapi::jiff::Timestamp>,
    /// The median round trip of the last probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_microseconds: Option<u32>,
    /// The largest probe that crossed the link and came back.
    #[serde(
        default,
        rename = "verifiedMTU",
        skip_serializing_if = "Option::is_none"
    )]
    pub verified_mtu: Option<u32>,
    /// What failed, when down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl HostFacts {
    /// This node's probe verdict on its link to `peer` in `class`.
    pub fn link_probe(&self, class: &str, peer: &str) -> Option<&LinkProbe> {
        self.link_probes
            .iter()
            .find(|p| p.class == class && p.peer == peer)
    }
}

/// One mapping the kernel refused on this node, as a host fact of the next plan (the second of
/// the stages `crate::plan` lists under "Kernel refusals, stage by stage").
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelRefusal {
    /// The mapping, `namespace/name`.
    pub mapping: String,
    /// What was refused and what the kernel said.
    pub message: String,
    /// The return link device whose refusal took the mapping's rules with it, when it was a
    /// link: the plan tells from it whether the mapping needed that link or only kept it as a
    /// standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

impl HostFacts {
    /// The address of a class interface, unless it lies in the stand-in block kuport reserves.
    pub fn interface_address(&self, name: &str) -> Option<Ipv4Addr> {
        self.interfaces
            .get(name)
            .copied()
            .filter(|a| !crate::ir::in_stand_in_block(*a))
    }

    /// The IPv6 address of a class interface, unless it lies in kuport's IPv6 stand-in block.
    pub fn interface_address6(&self, name: &str) -> Option<Ipv6Addr> {
        self.interfaces6
            .get(name)
            .copied()
            .filter(|a| !crate::ir::in_any_stand_in_block(IpAddr::V6(*a)))
    }
}

/// One host socket that takes traffic from outside the host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostSocket {
    /// TCP (a listener) or UDP (an unconnected socket).
    pub protocol: Protocol,
    /// The local address it is bound to: `0.0.0.0` for every address (IPv4 or `::`, which is
    /// taken as every address of both families), an IPv4 address, or an IPv6 one (a socket
    /// bound to one IPv6 address holds the port there only).
    pub address: IpAddr,
    /// The local port.
    pub port: u16,
    /// Who holds it, when the agent knows (its own health and metrics listeners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// The label an EndpointSlice names its Service by: the only label of a slice the plan reads.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// True when the Node's `Ready` condition is `True`.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c.type_ == conditions::READY && c.status == conditions::TRUE)
        })
}

/// The first IPv6 `InternalIP` of a Node a peer can send from: a dual-stack node's mesh or
/// underlay address (kubelet's `--node-ip` with one address of each family). Link-local
/// addresses and the stand-in block are skipped, as an interface's are.
pub fn node_internal_ip6(node: &Node) -> Option<Ipv6Addr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<Ipv6Addr>().ok())
        .find(|a| {
            !a.is_unicast_link_local()
                && !a.is_loopback()
                && !a.is_unspecified()
                && !crate::ir::in_any_stand_in_block(IpAddr::V6(*a))
        })
}

/// The first IPv4 `InternalIP` of a Node.
pub fn node_internal_ip(node: &Node) -> Option<Ipv4Addr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<Ipv4Addr>().ok())
        .find(|a| !crate::ir::in_stand_in_block(*a))
}
