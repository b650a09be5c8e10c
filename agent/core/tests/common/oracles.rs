//! What the plan's property tests compare the plan against: independent readings of the model
//! and of a plan.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kuport_core::api::{LinkClaim, PortMap, PortMapClass, ReturnPathMode};
use kuport_core::ir::{Family, Link, Rule, in_any_stand_in_block};
use kuport_core::keys::MappingKey;
use kuport_core::plan::{ChosenEndpoint, Plan};
use kuport_core::snapshot::{HostFacts, Snapshot};

use super::model::*;

/// Mirrors the plan's notion of a well-formed claim key: two distinct, non-empty node names in
/// bytewise order joined by one `/`.
pub fn well_formed_key(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && a < b && !b.contains('/'))
}

pub fn class_of<'a>(snap: &'a Snapshot, name: &str) -> &'a PortMapClass {
    snap.classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .expect("class exists")
}

/// The PortMap of a decision, as the plan read it.
pub fn portmap_of<'a>(snap: &'a Snapshot, namespace: &str, name: &str) -> &'a PortMap {
    snap.portmaps
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
        .expect("decision of a known PortMap")
}

/// The claims of a class as the plan read them from its status.
pub fn claims_of<'a>(snap: &'a Snapshot, class: &str) -> &'a [LinkClaim] {
    class_of(snap, class)
        .status
        .as_ref()
        .map_or(&[], |s| s.links.as_slice())
}

pub fn pair_key(a: &str, b: &str) -> String {
    if a <= b {
        format!("{a}/{b}")
    } else {
        format!("{b}/{a}")
    }
}

/// The global part of a plan: mappings with published addresses (of both families) blanked,
/// and each class's name, Ready and generation.
pub type GlobalPart = (
    Vec<kuport_core::plan::MappingDecision>,
    Vec<(String, String, String, Option<i64>)>,
);

pub fn global_part(p: &Plan) -> GlobalPart {
    let mut portmaps = p.portmaps.clone();
    for d in &mut portmaps {
        let mut rows = d.published.to_vec();
        for row in &mut rows {
            row.address.clear();
            row.address6.clear();
        }
        d.published = rows.into();
    }
    let classes = p
        .classes
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.ready.reason.as_str().to_owned(),
                c.ready.message.clone(),
                c.generation,
            )
        })
        .collect();
    (portmaps, classes)
}

pub fn spec_is_invalid(m: &Model, p: &PmM) -> Option<&'static str> {
    let port_ok = |n: i32| (1..=65535).contains(&n);
    if !m.classes.iter().any(|c| c.name == p.class) {
        return Some("class missing");
    }
    if p.end_port.is_some_and(|e| e < p.port) {
        return Some("endPort < port");
    }
    if !port_ok(p.port) || p.end_port.is_some_and(|e| !port_ok(e)) {
        return Some("port outside 1..65535");
    }
    if binds_hostile(m, p) {
        return Some("a hostile interface name");
    }
    None
}

/// The mapping would bind a hostile name: one of its own interfaces, or, when it names none,
/// one its class gives any node.
pub fn binds_hostile(m: &Model, p: &PmM) -> bool {
    let hostile = |i: &&str| HOSTILE_IFACES.contains(i);
    if !p.interfaces.is_empty() {
        return p.interfaces.iter().any(hostile);
    }
    m.classes
        .iter()
        .filter(|c| c.name == p.class)
        .flat_map(|c| c.nodes.values().flatten())
        .any(hostile)
}

// ---------------------------------------------------------------------------------------------
// The endpoint a mapping gets, read from the objects the plan reads (`docs/api.md`, "Endpoints"):
// independent of the plan's own index and address policy.

/// A chosen endpoint, as the oracle and the plan both describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointM {
    pub node: String,
    pub pod: Option<String>,
    pub address: IpAddr,
    pub address6: Option<Ipv6Addr>,
    pub port: u16,
}

impl EndpointM {
    pub fn of(ep: &ChosenEndpoint) -> Self {
        Self {
            node: ep.node.to_string(),
            pod: ep.pod.clone(),
            address: ep.address,
            address6: ep.address6,
            port: ep.port,
        }
    }
}

/// One endpoint a slice lists: (node, pod, first address as written, ready, pod port).
type Listed<'a> = (&'a str, Option<&'a str>, &'a str, bool, u16);

/// The slices of `family` (`IPv4`, `IPv6`) of the Service of `pm` that give its named port
/// with its protocol, each with the pod port it gives.
fn service_slices<'a>(
    snap: &'a Snapshot,
    pm: &PortMap,
    family: &str,
) -> Vec<(&'a EndpointSlice, u16)> {
    let namespace = pm.metadata.namespace.as_deref();
    let service = pm.spec.service_ref.name.as_str();
    let labelled = |s: &EndpointSlice| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .is_some_and(|v| v == service)
    };
    snap.endpoint_slices
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == namespace && s.address_type == family)
        .filter(|s| labelled(s))
        .filter_map(|s| {
            let port = s.ports.iter().flatten().find_map(|p| {
                let named = p.name.as_deref() == Some(pm.spec.service_ref.port.as_str());
                let same = p.protocol.as_deref().unwrap_or("TCP") == pm.spec.protocol.as_str();
                let port = u16::try_from(p.port?).ok().filter(|n| *n != 0)?;
                (named && same).then_some(port)
            })?;
            Some((s, port))
        })
        .collect()
}

/// The endpoints [`service_slices`] list, with the pod port of their slice.
fn listed<'a>(snap: &'a Snapshot, pm: &PortMap, family: &str) -> Vec<Listed<'a>> {
    let mut eps = Vec::new();
    for (s, port) in service_slices(snap, pm, family) {
        for ep in s.endpoints.iter().flatten() {
            let (Some(node), Some(address)) = (ep.node_name.as_deref(), ep.addresses.first())
            else {
                continue;
            };
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let pod = ep.target_ref.as_ref().and_then(|t| t.name.as_deref());
            eps.push((node, pod, address.as_str(), ready, port));
        }
    }
    eps
}

fn parse_net(text: &str) -> Option<IpNet> {
    text.trim().parse::<IpNet>().ok().map(|n| n.trunc())
}

/// The addresses a mapping of a class may deliver to: inside a pod network of the cluster and
/// none of a node's, a CNI gateway's, a return-link subnet's or a special one.
pub struct PodAddresses {
    pod_networks: Vec<IpNet>,
    node_addresses: BTreeSet<IpAddr>,
    gateways: BTreeSet<IpAddr>,
    link_subnets: Vec<IpNet>,
}

impl PodAddresses {
    pub fn new(snap: &Snapshot, class: &str) -> Self {
        let node_cidrs: Vec<IpNet> = snap
            .nodes
            .iter()
            .filter_map(|n| n.spec.as_ref())
            .flat_map(|s| s.pod_cidrs.iter().flatten().chain(s.pod_cidr.iter()))
            .filter_map(|c| parse_net(c))
            .collect();
        let gateways = node_cidrs
            .iter()
            .filter(|n| n.prefix_len() + 1 < n.max_prefix_len())
            .map(|n| match n {
                IpNet::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) + 1)),
                IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) + 1)),
            })
            .collect();
        let class_networks = snap
            .classes
            .iter()
            .filter(|c| c.metadata.name.as_deref() == Some(class))
            .flat_map(|c| c.spec.pod_networks.iter());
        let cni = snap.cni.iter().flat_map(|c| c.pod_cidrs.iter());
        let pod_networks = class_networks
            .chain(cni)
            .filter_map(|c| parse_net(c))
            .chain(node_cidrs)
            .collect();
        let listed = snap
            .nodes
            .iter()
            .filter_map(|n| n.status.as_ref()?.addresses.as_ref())
            .flatten()
            .map(|a| a.address.as_str());
        let rows = snap
            .classes
            .iter()
            .filter_map(|c| c.status.as_ref())
            .flat_map(|s| &s.nodes)
            .flat_map(|r| r.addresses.values().map(String::as_str));
        let node_addresses = listed
            .chain(rows)
            .filter_map(|a| a.trim().parse().ok())
            .collect();
        let link_subnets = snap
            .classes
            .iter()
            .filter(|c| c.spec.return_path.mode == ReturnPathMode::Vxlan)
            .flat_map(|c| {
                let v = &c.spec.return_path.vxlan;
                [parse_net(&v.subnet), parse_net(&v.subnet6)]
            })
            .flatten()
            .collect();
        Self {
            pod_networks,
            node_addresses,
            gateways,
            link_subnets,
        }
    }

    pub fn allows(&self, a: IpAddr) -> bool {
        let special = match a {
            IpAddr::V4(v4) => {
                v4.is_broadcast() || v4.octets()[0] >= 240 || v4.octets()[..2] == [169, 254]
            }
            IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some() || v6.is_unicast_link_local(),
        };
        !special
            && !a.is_loopback()
            && !a.is_unspecified()
            && !a.is_multicast()
            && !in_any_stand_in_block(a)
            && !self.link_subnets.iter().any(|n| n.contains(&a))
            && !self.node_addresses.contains(&a)
            && !self.gateways.contains(&a)
            && self.pod_networks.iter().any(|n| n.contains(&a))
    }
}

/// The endpoint of `pm` as the spec defines it: the Service's IPv4 endpoints when it lists the
/// port in any IPv4 slice, else its IPv6 ones; among the ready ones on a pod address, the
/// smallest by (the node's place among the class's accepting nodes, pod, node, address, pod
/// port). A pod chosen over IPv4 is served over IPv6 too at the smallest pod address its IPv6
/// slices list for the same pod on the same node with the same pod port.
pub fn expected_endpoint(snap: &Snapshot, pm: &PortMap) -> Option<EndpointM> {
    let class = pm.spec.class_name.as_str();
    let addresses = PodAddresses::new(snap, class);
    let accepting: Vec<&str> = class_of(snap, class)
        .spec
        .nodes
        .keys()
        .map(String::as_str)
        .filter(|n| {
            snap.nodes.iter().any(|node| {
                node.metadata.name.as_deref() == Some(*n)
                    && kuport_core::snapshot::node_is_ready(node)
            })
        })
        .collect();
    let rank = |node: &str| {
        accepting
            .iter()
            .position(|n| *n == node)
            .unwrap_or(accepting.len())
    };
    let v6 = service_slices(snap, pm, "IPv4").is_empty();
    let family = if v6 { "IPv6" } else { "IPv4" };
    let best = listed(snap, pm, family)
        .into_iter()
        .filter(|(_, _, _, ready, _)| *ready)
        .filter_map(|(node, pod, address, _, port)| {
            let address: IpAddr = address.parse().ok()?;
            (address.is_ipv6() == v6 && addresses.allows(address))
                .then(|| (rank(node), pod, node, address, port))
        })
        .min()?;
    let (_, pod, node, address, port) = best;
    let address6 = pod.filter(|_| !v6).and_then(|pod| {
        listed(snap, pm, "IPv6")
            .into_iter()
            .filter(|e| e.0 == node && e.1 == Some(pod) && e.3 && e.4 == port)
            .filter_map(|e| e.2.parse::<Ipv6Addr>().ok())
            .filter(|a| addresses.allows(IpAddr::V6(*a)))
            .min()
    });
    Some(EndpointM {
        node: node.to_owned(),
        pod: pod.map(str::to_owned),
        address,
        address6,
        port,
    })
}

// ---------------------------------------------------------------------------------------------
// The families of a host state.

/// Every address a rule names. Spelled out per variant, so a new rule kind must say.
pub fn rule_addresses(rule: &Rule) -> Vec<IpAddr> {
    match rule {
        Rule::GuardAllow { peers, .. } => peers.iter().map(|p| IpAddr::V4(*p)).collect(),
        Rule::MarkRequest(s) | Rule::Steer(s) => vec![s.daddr],
        Rule::Dnat(d) => vec![d.to],
        Rule::Hairpin(h) => vec![h.daddr, h.to],
        Rule::LinkPeerSnat {
            client,
            peer_end,
            own_end,
            ..
        } => vec![client.addr(), *peer_end, *own_end],
        Rule::IdentitySnat(s) => vec![s.daddr],
        Rule::GuardDrop { .. }
        | Rule::RestoreReplyMark { .. }
        | Rule::RestoreRequestMark { .. }
        | Rule::SaveArrivalLink { .. }
        | Rule::MarkArrival { .. }
        | Rule::ClampMssOut
        | Rule::ClampMssIn
        | Rule::HairpinMasquerade { .. } => Vec::new(),
    }
}

/// A link's end in `family`: (this node's, the peer's).
pub fn link_ends(link: &Link, family: Family) -> (Option<IpAddr>, Option<IpAddr>) {
    match family {
        Family::V4 => (
            Some(IpAddr::V4(link.address.addr())),
            Some(IpAddr::V4(link.peer_address)),
        ),
        Family::V6 => (
            link.address6.map(|a| IpAddr::V6(a.addr())),
            link.peer_address6.map(IpAddr::V6),
        ),
    }
}

/// Where a mapping's packets may be sent in `family`: its pod's address in that family, or the
/// peer's end of a link of its class toward the pod's node.
fn allowed_target(p: &Plan, owner: Option<&String>, family: Family, to: IpAddr) -> bool {
    let Some(d) = owner.and_then(|o| {
        p.portmaps
            .iter()
            .find(|d| MappingKey::new(&d.namespace, &d.name).as_str() == o)
    }) else {
        return false;
    };
    let Some(ep) = &d.endpoint else { return false };
    ep.address_in(family) == Some(to)
        || p.host_state.links.iter().any(|l| {
            l.class == d.class.as_str()
                && l.peer == ep.node.as_str()
                && ep.address_in(family).is_some()
                && link_ends(l, family).1 == Some(to)
        })
}

/// What is wrong with the families of one table of `p`: a table of the other family, an
/// address of the other family, a rule the table's family cannot hold, a DNAT (or hairpin, or
/// identity SNAT) toward anything but the mapping's pod or its link's far end in the family, a
/// steering rule capturing an address that is not this node's in the family, a link-peer SNAT
/// not between the two ends of one of this node's links.
pub fn table_family_faults(p: &Plan, facts: &HostFacts, family: Family) -> Vec<String> {
    let table = p.host_state.table(family);
    let mut out = Vec::new();
    if table.family != family {
        out.push(format!("the {family} table says it is {}", table.family));
    }
    for net in &table.hairpin_sources {
        if Family::of(net.addr()) != family {
            out.push(format!("hairpin source {net} in the {family} table"));
        }
    }
    let owners = table.owners();
    let own_address = |iif: &str| match family {
        Family::V4 => facts.interface_address(iif).map(IpAddr::V4),
        Family::V6 => facts.interface_address6(iif).map(IpAddr::V6),
    };
    let link_end = |iif: &str| {
        p.host_state
            .links
            .iter()
            .find(|l| l.name == iif)
            .and_then(|l| link_ends(l, family).0)
    };
    for (chain, rules) in &table.chains {
        for rule in rules {
            let mixed = rule_addresses(rule)
                .into_iter()
                .any(|a| Family::of(a) != family);
            let v4_only = matches!(rule, Rule::GuardAllow { .. } | Rule::GuardDrop { .. });
            // A link-peer SNAT translates a client toward the far end of one of this node's
            // links to this node's end of the same link, in the table's family; never one of
            // this node's own interface addresses in IPv6 (no loop guard needs it there).
            let bad_peer_snat = match rule {
                Rule::LinkPeerSnat {
                    client,
                    peer_end,
                    own_end,
                    ..
                } => {
                    let on_a_link = p.host_state.links.iter().any(|l| {
                        let (own, peer) = link_ends(l, family);
                        own == Some(*own_end) && peer == Some(*peer_end)
                    });
                    let own_client = family == Family::V6
                        && facts
                            .interfaces6
                            .values()
                            .any(|a| client.contains(&IpAddr::V6(*a)));
                    !on_a_link || own_client
                }
                _ => false,
            };
            let target = match rule {
                Rule::Dnat(d) => Some(d.to),
                Rule::Hairpin(h) => Some(h.to),
                Rule::IdentitySnat(s) => Some(s.daddr),
                _ => None,
            };
            let bad_target =
                target.is_some_and(|to| !allowed_target(p, owners.of_rule(rule), family, to));
            let bad_capture = match rule {
                Rule::Steer(s) | Rule::MarkRequest(s) => {
                    own_address(&s.iif) != Some(s.daddr) && link_end(&s.iif) != Some(s.daddr)
                }
                Rule::Hairpin(h) => p
                    .host_state
                    .valid_mark_interfaces
                    .iter()
                    .all(|i| own_address(i) != Some(h.daddr)),
                _ => false,
            };
            if mixed
                || (v4_only && family == Family::V6)
                || bad_target
                || bad_capture
                || bad_peer_snat
            {
                out.push(format!("{family} table, {chain:?}: {rule:?}"));
            }
        }
    }
    out
}

/// What is wrong with the families of the ip rules and routes of `p`: a destination or
/// gateway of another family than the rule's or the route's, an IPv6 route not via a link's
/// IPv6 end, IPv6 routing without an `ip6` table.
pub fn routing_family_faults(p: &Plan) -> Vec<String> {
    let s = &p.host_state;
    let mut out = Vec::new();
    for r in &s.rules {
        if r.to.is_some_and(|to| Family::of(to.addr()) != r.family)
            || (r.family == Family::V6 && s.nft6.is_empty())
        {
            out.push(format!("ip rule {r:?}"));
        }
    }
    for r in &s.routes {
        let via_link6 = s
            .links
            .iter()
            .any(|l| l.name == r.dev && l.peer_address6.map(IpAddr::V6) == Some(r.via));
        if r.to
            .is_some_and(|to| Family::of(to.addr()) != Family::of(r.via))
            || (r.via.is_ipv6() && !via_link6)
        {
            out.push(format!("route {r:?}"));
        }
    }
    out
}
