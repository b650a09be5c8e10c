//! Endpoint choice: one pod per mapping, identical on every agent.

use std::net::{IpAddr, Ipv6Addr};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use super::fast_hash::FastMap;
use super::index::{Index, ServiceSlices};
use super::state::ClassState;
use super::{ChosenEndpoint, RejectedEndpoint};
use crate::api::PortMap;
use crate::keys::MappingKey;

/// A ready endpoint as it ranks: (node's rank among the accepting nodes, pod name, node name,
/// address, pod port). The smallest is chosen.
pub type Candidate<'a> = (usize, Option<&'a str>, &'a str, IpAddr, u16);

/// How many rejected endpoints a decision lists (a slice may list thousands); the message
/// counts them all.
pub const LISTED_REJECTIONS: usize = 8;

/// The endpoint chosen for a mapping, and the ready endpoints left out because their address is
/// not a pod address of the cluster.
#[derive(Debug, Default)]
pub struct Choice<'a> {
    pub endpoint: Option<ChosenEndpoint>,
    /// Every ranked endpoint, best first, when there are two or more (a lone one is only the
    /// endpoint, kept without a list): the endpoint is the first, and [`next_nodes`] reads
    /// where it would move from the rest without ranking them again.
    pub ranked: Vec<Candidate<'a>>,
    /// The first [`LISTED_REJECTIONS`], sorted by address, node and pod.
    pub rejected: Vec<RejectedEndpoint>,
    /// How many were rejected in all.
    pub rejected_count: usize,
}

/// The endpoint of `pm`: among ready endpoints listing the named port with the mapping's
/// protocol whose address is a pod address of the cluster, sorted by (a) the node's rank among
/// the accepting nodes (others after them), (b) the pod name, (c) the node name, (d) the
/// address. `rank`: each accepting node's place in the sorted accepting list.
///
/// The IPv4 endpoints are ranked when the Service lists any for the port, else the IPv6 ones
/// (an IPv6-only Service). A dual-stack Service's chosen pod is served over IPv6 too, at the
/// IPv6 address its IPv6 slices list for the same pod ([`Self::address6`]).
pub fn choose<'a>(index: &Index<'a>, pm: &'a PortMap, class: &ClassState) -> Choice<'a> {
    let rank = &class.rank;
    let mut ranked = Vec::new();
    let mut lone = None;
    let mut rejected = Vec::new();
    let mut family = "IPv4";
    if service_slices(index, pm, family).next().is_none() {
        family = "IPv6";
    }
    for candidate in candidates(index, pm, rank, family) {
        match candidate {
            Ok(c) if ranked.is_empty() && lone.is_none() => lone = Some(c),
            Ok(c) => ranked.extend(lone.take().into_iter().chain([c])),
            Err(r) => rejected.push(r),
        }
    }
    // Candidates are whole tuples: equal ones are identical, so the first after an unstable
    // sort is the smallest, whichever equal one it is.
    ranked.sort_unstable();
    let best = lone.or_else(|| ranked.first().copied());
    rejected.sort();
    rejected.dedup();
    let rejected_count = rejected.len();
    rejected.truncate(LISTED_REJECTIONS);
    Choice {
        endpoint: best.map(|(rank, pod, node, address, port)| ChosenEndpoint {
            // An endpoint on an accepting node has its name at its rank already.
            node: match class.accepting_names.get(rank) {
                Some(name) => name.clone(),
                None => index.name(node),
            },
            address,
            address6: match (address, pod) {
                (IpAddr::V4(_), Some(pod)) => address6(index, pm, (node, pod, port)),
                _ => None,
            },
            port,
            pod: pod.map(str::to_owned),
        }),
        ranked,
        rejected,
        rejected_count,
    }
}

/// Why no endpoint of `choice` is used, when ready ones were all rejected: a sentence naming
/// the first few and counting the rest. The Service is named only when there is something to
/// say.
pub fn rejection_message(namespace: &str, service: &str, choice: &Choice) -> Option<String> {
    if choice.endpoint.is_some() || choice.rejected.is_empty() {
        return None;
    }
    let service = MappingKey::new(namespace, service);
    let service = service.as_str();
    let listed: Vec<String> = choice
        .rejected
        .iter()
        .map(|r| {
            let pod = r
                .pod
                .as_deref()
                .map_or(String::new(), |p| format!(" (pod {p})"));
            format!("{} on node {}{pod} is {}", r.address, r.node, r.reason)
        })
        .collect();
    let more = choice.rejected_count.saturating_sub(choice.rejected.len());
    let more = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    Some(format!(
        "service {service} lists no endpoint kuport may deliver to, only addresses that are not pod addresses of the cluster: {}{more}",
        listed.join("; ")
    ))
}

/// The nodes the endpoint would move to next, in the order [`choose`] ranks endpoints
/// (`ranked`, from its [`Choice`]): the nodes of the other ready endpoints, each once, leaving
/// out `exclude`, at most `limit`.
pub fn next_nodes<'a>(ranked: &[Candidate<'a>], exclude: &[&str], limit: usize) -> Vec<&'a str> {
    let mut nodes: Vec<&'a str> = Vec::new();
    for (_, _, node, _, _) in ranked.iter().copied() {
        if nodes.len() == limit {
            break;
        }
        if !exclude.contains(&node) && !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    nodes
}

/// The slices of `family` (`IPv4`, `IPv6`) of the mapping's Service that list its named port
/// with its protocol, each with the pod port it gives: the one rule both families are read by.
fn service_slices<'a>(
    index: &Index<'a>,
    pm: &'a PortMap,
    family: &'static str,
) -> impl Iterator<Item = (&'a EndpointSlice, u16)> {
    let namespace = pm.metadata.namespace.as_deref().unwrap_or_default();
    let service = pm.spec.service_ref.name.as_str();
    let wanted_port = pm.spec.service_ref.port.as_str();
    let protocol = pm.spec.protocol.as_str();
    index
        .slices
        .get(&(namespace, service))
        .into_iter()
        .flat_map(ServiceSlices::iter)
        .filter(move |slice| slice.address_type == family)
        .filter_map(move |slice| {
            let pod_port = slice.ports.iter().flatten().find_map(|p| {
                let named = p.name.as_deref() == Some(wanted_port);
                let same_protocol = p.protocol.as_deref().unwrap_or("TCP") == protocol;
                let port = p
                    .port
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|n| *n != 0)?;
                (named && same_protocol).then_some(port)
            })?;
            Some((slice, pod_port))
        })
}

/// Whether an endpoint is ready (an absent condition counts as ready, as Kubernetes says).
fn is_ready(ep: &Endpoint) -> bool {
    ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
}

/// The IPv6 address of the chosen pod (`node`, `pod`, pod port) in the Service's IPv6 slices:
/// ready, on the same node with the same pod port, and a pod address of the cluster. `None`
/// when the pod has none (an IPv4-only Service), so the mapping is served over IPv4 alone.
fn address6(index: &Index, pm: &PortMap, (node, pod, port): (&str, &str, u16)) -> Option<Ipv6Addr> {
    let class = pm.spec.class_name.as_str();
    let mut found: Vec<Ipv6Addr> = service_slices(index, pm, "IPv6")
        .filter(|(_, pod_port)| *pod_port == port)
        .flat_map(|(slice, _)| slice.endpoints.iter().flatten())
        .filter(|ep| is_ready(ep) && ep.node_name.as_deref() == Some(node))
        .filter(|ep| ep.target_ref.as_ref().and_then(|t| t.name.as_deref()) == Some(pod))
        .filter_map(|ep| ep.addresses.first()?.parse::<Ipv6Addr>().ok())
        .filter(|a| index.addresses.verdict(class, IpAddr::V6(*a)).is_ok())
        .collect();
    // Two slices naming the same pod with different addresses: the smallest, on every agent.
    found.sort_unstable();
    found.first().copied()
}

/// Every ready endpoint of `family` of the mapping's Service that lists its named port with
/// its protocol: ranked when its address is a pod address of the cluster, else rejected.
fn candidates<'a>(
    index: &Index<'a>,
    pm: &'a PortMap,
    rank: &FastMap<&str, usize>,
    family: &'static str,
) -> impl Iterator<Item = Result<Candidate<'a>, RejectedEndpoint>> {
    let class = pm.spec.class_name.as_str();
    let v6 = family == "IPv6";
    service_slices(index, pm, family).flat_map(move |(slice, pod_port)| {
        slice.endpoints.iter().flatten().filter_map(move |ep| {
            let ready = is_ready(ep);
            let node = ep.node_name.as_deref()?;
            let address = ep
                .addresses
                .first()
                .and_then(|a| a.parse::<IpAddr>().ok())
                .filter(|a| a.is_ipv6() == v6)?;
            if !ready {
                return None;
            }
            let pod = ep.target_ref.as_ref().and_then(|t| t.name.as_deref());
            if let Err(reason) = index.addresses.verdict(class, address) {
                return Some(Err(RejectedEndpoint {
                    address,
                    node: node.to_owned(),
                    pod: pod.map(str::to_owned),
                    reason,
                }));
            }
            let rank = rank.get(node).copied().unwrap_or(rank.len());
            Some(Ok((rank, pod, node, address, pod_port)))
        })
    })
}
