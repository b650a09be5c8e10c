//! Which endpoint addresses kuport delivers to: pod addresses of the cluster, and never an
//! address of a node or of kuport itself.
//!
//! An EndpointSlice is written by whoever may write EndpointSlices in the namespace, not only by
//! the EndpointSlice controller, so its addresses are claims, not facts. Delivering to a node's
//! own address would hand the internet to a host service (steering moves the packet past the
//! host firewall by design), so an endpoint is used only when its address lies in a pod network
//! of the cluster and is none of the addresses below.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Pod};

use super::MappingDecision;
use super::fast_hash::FastMap;
use crate::api::{ClassNodeStatus, PortMapClass, ReturnPathMode};
use crate::keys::MappingKey;
use crate::snapshot::{CILIUM_HOST_ANNOTATIONS, CniFacts, HostFacts};

/// How many pod networks a refusal message lists before it counts the rest.
const LISTED_NETWORKS: usize = 4;

/// The addresses endpoints may and may not have, built once per pass.
#[derive(Debug, Default)]
pub struct AddressPolicy<'a> {
    /// The cluster's pod networks: every Node's `spec.podCIDRs` and the CNI's cluster pool,
    /// sorted and deduplicated.
    pod_networks: Vec<IpNet>,
    /// Per class, the extra pod networks its `spec.podNetworks` names.
    class_networks: BTreeMap<&'a str, Vec<IpNet>>,
    /// Every address a Node lists, with the node (the first by name when two list one
    /// address). Only looked up, once per endpoint.
    node_addresses: FastMap<IpAddr, &'a str>,
    /// Per class, the interface addresses (both families) its nodes reported in their rows of
    /// that class, with the node. A row counts only in its own class: a node named by one
    /// class cannot, by listing a pod's address in its row there, refuse another class's
    /// mappings to that pod. Only looked up, once per endpoint.
    row_addresses: FastMap<(&'a str, IpAddr), &'a str>,
    /// The addresses of a node's own host inside its pod CIDR ([`gateway_addresses`]), with
    /// the node.
    /// Only looked up, once per endpoint.
    gateways: FastMap<IpAddr, &'a str>,
    /// Every Vxlan class's link subnets (IPv4 and IPv6), with its class, sorted.
    link_subnets: Vec<(IpNet, &'a str)>,
    /// Each node's own pod CIDRs ([`own_pod_cidrs`]), sorted: the sources its pods have.
    node_pod_cidrs: BTreeMap<&'a str, Vec<IpNet>>,
}

/// The cluster's pod networks: every Node's pod CIDRs and the CNI's own pool, sorted.
fn pod_networks(nodes: &[Node], cni: Option<&CniFacts>) -> Vec<IpNet> {
    let mut pod_networks: Vec<IpNet> = nodes
        .iter()
        .filter_map(|n| n.spec.as_ref())
        .flat_map(|spec| {
            spec.pod_cidrs
                .iter()
                .flatten()
                .chain(spec.pod_cidr.iter())
                .filter_map(|c| parse_net(c))
        })
        .chain(
            cni.iter()
                .flat_map(|c| c.pod_cidrs.iter())
                .filter_map(|c| parse_net(c)),
        )
        .collect();
    pod_networks.sort();
    pod_networks.dedup();
    pod_networks
}

/// A Node's `spec.podCIDRs` and `spec.podCIDR`, as prefixes.
fn pod_cidrs_of(node: &Node) -> impl Iterator<Item = IpNet> + '_ {
    node.spec
        .iter()
        .flat_map(|s| s.pod_cidrs.iter().flatten().chain(s.pod_cidr.iter()))
        .filter_map(|c| parse_net(c))
}

/// Each node's pod CIDRs that hold only its own pods: from its Node's `spec` (the control
/// plane's allocation, not anything the node reports), leaving out a CIDR that overlaps
/// another Node's (the same pool listed on every Node says nothing of which node a pod is on)
/// or holds an address a Node lists (then it is not only pods). Sorted.
fn own_pod_cidrs(nodes: &[Node]) -> BTreeMap<&str, Vec<IpNet>> {
    let mut all: Vec<(IpNet, &str)> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .flat_map(|(name, n)| pod_cidrs_of(n).map(move |c| (c, name)))
        .collect();
    all.sort_unstable();
    all.dedup();
    let mut node_ips: Vec<IpAddr> = nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.addresses.as_ref())
        .flatten()
        .filter_map(|a| a.address.trim().parse().ok())
        .collect();
    node_ips.sort_unstable();
    // Sorted by network address then length, each CIDR comes after every CIDR containing it
    // (prefixes either nest or are apart): the stack holds those still open.
    let mut shared = vec![false; all.len()];
    let mut open: Vec<usize> = Vec::new();
    for (i, (net, node)) in all.iter().enumerate() {
        while open.last().is_some_and(|&j| !all[j].0.contains(net)) {
            open.pop();
        }
        for &j in &open {
            if all[j].1 != *node {
                shared[i] = true;
                shared[j] = true;
            }
        }
        open.push(i);
    }
    let mut out: BTreeMap<&str, Vec<IpNet>> = BTreeMap::new();
    for ((net, node), shared) in all.into_iter().zip(shared) {
        let first = node_ips.partition_point(|a| *a < net.network());
        let holds_node_ip = node_ips.get(first).is_some_and(|a| net.contains(a));
        if !shared && !holds_node_ip {
            out.entry(node).or_default().push(net);
        }
    }
    out
}

/// Each node's CNI gateway addresses, to the node (the first by name when two claim one).
fn gateways(nodes: &[Node]) -> FastMap<IpAddr, &str> {
    let mut gateways: Vec<(IpAddr, &str)> = nodes
        .iter()
        .flat_map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            gateway_addresses(n).into_iter().map(move |a| (a, name))
        })
        .collect();
    gateways.sort();
    let mut gateway_of = FastMap::default();
    for (address, node) in gateways {
        gateway_of.entry(address).or_insert(node);
    }
    gateway_of
}

impl<'a> AddressPolicy<'a> {
    /// The policy over the cluster's Nodes, classes (spec and rows) and CNI facts.
    pub fn build(
        nodes: &'a [Node],
        classes: &BTreeMap<&'a str, &'a PortMapClass>,
        // Iterated in hash order: the addresses it yields are sorted (with their node) below.
        rows: &FastMap<(&'a str, &'a str), &'a ClassNodeStatus>,
        cni: Option<&CniFacts>,
    ) -> Self {
        let class_networks = classes
            .iter()
            .map(|(name, class)| {
                let mut nets: Vec<IpNet> = class
                    .spec
                    .pod_networks
                    .iter()
                    .filter_map(|c| parse_net(c))
                    .collect();
                nets.sort();
                nets.dedup();
                (*name, nets)
            })
            .filter(|(_, nets)| !nets.is_empty())
            .collect();
        let mut node_addresses = FastMap::default();
        let mut listed: Vec<(IpAddr, &str)> = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.status.as_ref()?)))
            .flat_map(|(name, status)| {
                status
                    .addresses
                    .iter()
                    .flatten()
                    .filter_map(move |a| Some((a.address.trim().parse().ok()?, name)))
            })
            .collect();
        listed.sort();
        for (address, node) in listed {
            node_addresses.entry(address).or_insert(node);
        }
        let mut row_listed: Vec<(&str, IpAddr, &str)> = rows
            .iter()
            .flat_map(|((class, node), row)| {
                row.addresses
                    .values()
                    .chain(row.addresses6.values())
                    .filter_map(move |a| Some((*class, a.trim().parse().ok()?, *node)))
            })
            .collect();
        row_listed.sort();
        let mut row_addresses = FastMap::default();
        for (class, address, node) in row_listed {
            row_addresses.entry((class, address)).or_insert(node);
        }
        let mut link_subnets: Vec<(IpNet, &str)> = classes
            .iter()
            .filter(|(_, c)| c.spec.return_path.mode == ReturnPathMode::Vxlan)
            .flat_map(|(name, c)| {
                let vxlan = &c.spec.return_path.vxlan;
                [parse_net(&vxlan.subnet), parse_net(&vxlan.subnet6)]
                    .into_iter()
                    .flatten()
                    .map(move |net| (net, *name))
            })
            .collect();
        link_subnets.sort();
        Self {
            pod_networks: pod_networks(nodes, cni),
            class_networks,
            node_addresses,
            row_addresses,
            gateways: gateways(nodes),
            link_subnets,
            node_pod_cidrs: own_pod_cidrs(nodes),
        }
    }

    /// `node`'s own pod CIDRs (see [`own_pod_cidrs`]), sorted; none when its Node lists none.
    pub fn pod_cidrs_of(&self, node: &str) -> &[IpNet] {
        self.node_pod_cidrs
            .get(node)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Every pod network the cluster knows (the Nodes' and the CNI's, and every class's
    /// `spec.podNetworks`), sorted: the addresses a client inside the cluster's pods has.
    pub fn all_pod_networks(&self) -> Vec<IpNet> {
        let mut nets: Vec<IpNet> = self
            .pod_networks
            .iter()
            .chain(self.class_networks.values().flatten())
            .copied()
            .collect();
        nets.sort();
        nets.dedup();
        nets
    }

    /// Whether a mapping of `class` may deliver to `address`; the refusal says why, as a
    /// phrase completing "the endpoint address 10.0.0.1 is ...".
    pub fn verdict(&self, class: &str, address: IpAddr) -> Result<(), String> {
        if let Some(refusal) = special_address(address) {
            return Err(refusal);
        }
        if let Some((net, owner)) = self.link_subnets.iter().find(|(n, _)| n.contains(&address)) {
            return Err(format!(
                "inside {net}, the return-link subnet of class {owner}"
            ));
        }
        if is_link_local(address) {
            return Err("a link-local address".to_owned());
        }
        let of_node = self.node_addresses.get(&address);
        if let Some(node) = of_node.or_else(|| self.row_addresses.get(&(class, address))) {
            return Err(format!("an address of node {node}"));
        }
        if let Some(node) = self.gateways.get(&address) {
            return Err(format!(
                "an address of node {node}'s own host in its pod CIDR (the CNI's gateway)"
            ));
        }
        let extra = self
            .class_networks
            .get(class)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut networks = self.pod_networks.iter().chain(extra);
        if networks.clone().any(|n| n.contains(&address)) {
            return Ok(());
        }
        if networks.next().is_none() {
            return Err(format!(
                "not in a known pod network: no Node lists spec.podCIDRs, the CNI names no cluster pool and class {class} sets no spec.podNetworks"
            ));
        }
        let mut all: Vec<String> = self
            .pod_networks
            .iter()
            .chain(extra)
            .map(ToString::to_string)
            .collect();
        all.sort();
        all.dedup();
        let shown = if all.len() > LISTED_NETWORKS {
            format!(
                "{} … +{}",
                all[..LISTED_NETWORKS].join(", "),
                all.len() - LISTED_NETWORKS
            )
        } else {
            all.join(", ")
        };
        Err(format!("outside the cluster's pod networks ({shown})"))
    }
}

/// Why an address is never a pod's whatever the cluster says: loopback, not unicast, inside a
/// stand-in block, an IPv4 address written as IPv6.
fn special_address(address: IpAddr) -> Option<String> {
    if address.is_loopback() {
        return Some("a loopback address".to_owned());
    }
    let not_unicast = match address {
        IpAddr::V4(a) => a.is_broadcast() || a.octets()[0] >= 240,
        IpAddr::V6(_) => false,
    };
    if address.is_unspecified() || address.is_multicast() || not_unicast {
        return Some("not a unicast address".to_owned());
    }
    if let IpAddr::V6(a) = address
        && a.to_ipv4_mapped().is_some()
    {
        return Some("an IPv4-mapped IPv6 address".to_owned());
    }
    if crate::ir::in_any_stand_in_block(address) {
        let (block, len) = match address {
            IpAddr::V4(_) => {
                let (b, l) = crate::ir::STAND_IN_BLOCK;
                (IpAddr::V4(b), l)
            }
            IpAddr::V6(_) => {
                let (b, l) = crate::ir::STAND_IN6_BLOCK;
                (IpAddr::V6(b), l)
            }
        };
        return Some(format!("inside {block}/{len}, kuport's stand-in block"));
    }
    None
}

/// 169.254.0.0/16 or fe80::/10.
fn is_link_local(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.is_unicast_link_local(),
    }
}

/// Addresses of a node's own host inside its pod CIDR, which no Node address lists: the first
/// address of each of its pod CIDRs (where bridge and point-to-point CNIs put the node's
/// gateway) and the `cilium_host` address Cilium's annotation names. The node that translates
/// to an endpoint also refuses any address of its own host (`refused_endpoint`); these are known
/// to every agent at once, so no node forwards toward them at all.
fn gateway_addresses(node: &Node) -> Vec<IpAddr> {
    let spec = node.spec.as_ref();
    let cidrs = spec
        .into_iter()
        .flat_map(|s| s.pod_cidrs.iter().flatten().chain(s.pod_cidr.iter()));
    let first = cidrs
        .filter_map(|c| parse_net(c))
        .filter(|n| n.prefix_len() + 1 < n.max_prefix_len())
        .map(|n| match n {
            IpNet::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) + 1)),
            IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) + 1)),
        });
    let annotated = node
        .metadata
        .annotations
        .iter()
        .flat_map(|a| {
            CILIUM_HOST_ANNOTATIONS
                .iter()
                .filter_map(move |k| a.get(*k))
        })
        .filter_map(|v| v.trim().parse().ok());
    first.chain(annotated).collect()
}

/// A CIDR of either family as written (host bits allowed, as in `podCIDR` values); `None`
/// otherwise.
fn parse_net(text: &str) -> Option<IpNet> {
    text.trim().parse::<IpNet>().ok().map(|n| n.trunc())
}

/// The addresses of the Pods the snapshot lists, each with the node it is bound to and its
/// namespace: what the endpoint's node checks an endpoint against. Pods on the host network are
/// left out (their address is the node's). A Pod that ended (`Succeeded`, `Failed`) or is being
/// deleted still counts for its address until a running Pod holds it: the kubelet reports the
/// end before the EndpointSlice controller drops the endpoint, and refusing in between would
/// flap the mapping's status; once the address is reused, the running Pod decides.
#[derive(Debug, Default)]
pub struct PodAddresses<'a> {
    /// Whether the snapshot lists every Pod of the node planned for
    /// ([`crate::snapshot::Snapshot::pods_listed`]); when not, nothing is checked.
    listed: bool,
    /// (gone, node, namespace) by address, the least kept: a running Pod before a gone one,
    /// then by node and namespace, so the answer does not depend on list order.
    owner: FastMap<IpAddr, (bool, &'a str, &'a str)>,
}

impl<'a> PodAddresses<'a> {
    pub fn build(pods: &'a [Pod], listed: bool) -> Self {
        let mut owner = FastMap::default();
        if !listed {
            return Self { listed, owner };
        }
        for pod in pods {
            let (Some(spec), Some(status)) = (&pod.spec, &pod.status) else {
                continue;
            };
            let (Some(node), Some(namespace)) =
                (spec.node_name.as_deref(), pod.metadata.namespace.as_deref())
            else {
                continue;
            };
            if spec.host_network == Some(true) {
                continue;
            }
            let gone = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
                || pod.metadata.deletion_timestamp.is_some();
            let ips = status.pod_ips.iter().flatten().map(|p| p.ip.as_str());
            for ip in ips.chain(status.pod_ip.as_deref()) {
                if let Ok(address) = ip.trim().parse::<IpAddr>() {
                    let claim = (gone, node, namespace);
                    owner
                        .entry(address)
                        .and_modify(|o: &mut (bool, &'a str, &'a str)| *o = (*o).min(claim))
                        .or_insert(claim);
                }
            }
        }
        Self { listed, owner }
    }

    /// Whether `address` may be delivered to on `node` for a mapping of `namespace`: a Pod of
    /// that namespace bound to `node` has it, or the Pods are not known.
    fn is_pod_of(&self, address: IpAddr, node: &str, namespace: &str) -> bool {
        !self.listed
            || self
                .owner
                .get(&address)
                .is_some_and(|(_, n, ns)| *n == node && *ns == namespace)
    }
}

/// On the node that translates a mapping to its endpoint (the endpoint's node), why it must not:
/// the endpoint's address is one of this host's own, or no Pod of the mapping's namespace bound
/// to this node has it. The plan's checks see only the addresses Nodes and rows list; a host
/// also holds addresses inside its pod CIDR (the CNI's gateway on `cilium_host` or a bridge),
/// and delivering there would hand the port to a host service past the host firewall. And an
/// EndpointSlice is the word of whoever wrote it: one naming this node with another node's
/// gateway address would have this node forward the traffic on to that host, and one listing
/// another tenant's pod would publish that pod. The node leaves the mapping out and reports why
/// in the class status.
pub fn refused_endpoint(
    d: &MappingDecision,
    this_node: &str,
    facts: &HostFacts,
    pods: &PodAddresses,
) -> Option<String> {
    let ep = d.endpoint.as_ref().filter(|ep| ep.node == this_node)?;
    if let Some(address) = ep.addresses().find(|a| facts.local_addresses.contains(a)) {
        return Some(local_endpoint_message(address));
    }
    ep.addresses()
        .find(|a| !pods.is_pod_of(*a, this_node, &d.namespace))
        .map(|a| not_a_pod_message(a, &d.namespace))
}

/// What the endpoint's node reports when no Pod of the mapping's namespace bound to it has the
/// endpoint's address. Compared exactly by the accepting nodes, as [`local_endpoint_message`].
pub fn not_a_pod_message(address: IpAddr, namespace: &str) -> String {
    format!(
        "the endpoint address {address} is not an address of a Pod of namespace {namespace} bound to this node: kuport delivers only to the mapping's own pods on the node its EndpointSlice names"
    )
}

/// What the endpoint's node reports when it refuses an endpoint at its own address. The
/// accepting nodes compare the class's `status.refused` entries with it exactly (both sides run
/// this function on the same endpoint), and stop forwarding such a mapping into the link: the
/// pod node leaves out the half that would take the traffic off the link, so it would
/// otherwise be delivered to the pod node's own link address.
pub fn local_endpoint_message(address: IpAddr) -> String {
    format!(
        "the endpoint address {address} is an address of this host, not a pod's: kuport delivers only to pods"
    )
}

/// True when the endpoint's node reported (in the class status) that the endpoint is an
/// address of its own host, or of no Pod bound to it: no accepting node forwards the mapping
/// then.
pub fn refused_by_endpoint_node(class: &PortMapClass, d: &MappingDecision) -> bool {
    let Some(ep) = &d.endpoint else {
        return false;
    };
    let Some(status) = &class.status else {
        return false;
    };
    if status.refused.is_empty() {
        return false;
    }
    let mapping = MappingKey::new(&d.namespace, &d.name);
    ep.addresses().any(|address| {
        let messages = [
            local_endpoint_message(address),
            not_a_pod_message(address, &d.namespace),
        ];
        status
            .refused
            .iter()
            .any(|r| r.node == ep.node && mapping == r.mapping && messages.contains(&r.message))
    })
}
