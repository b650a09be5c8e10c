//! Endpoint choice: one pod per mapping, identical on every agent.

use std::net::Ipv4Addr;

use super::ChosenEndpoint;
use super::index::Index;
use crate::api::PortMap;

/// The endpoint of `pm`: among ready IPv4 endpoints listing the named port with the mapping's
/// protocol, sorted by (a) the node's rank among the accepting nodes (others after them),
/// (b) the pod name, (c) the node name, (d) the address. `accepting` is sorted by name.
pub fn choose(index: &Index, pm: &PortMap, accepting: &[&str]) -> Option<ChosenEndpoint> {
    let namespace = pm.metadata.namespace.as_deref().unwrap_or_default();
    let service = pm.spec.service_ref.name.as_str();
    let wanted_port = pm.spec.service_ref.port.as_str();
    let protocol = pm.spec.protocol.as_str();
    let mut best: Option<(usize, Option<&str>, &str, Ipv4Addr, u16)> = None;
    for slice in index
        .slices
        .get(&(namespace, service))
        .into_iter()
        .flatten()
    {
        if slice.address_type != "IPv4" {
            continue;
        }
        let Some(pod_port) = slice.ports.iter().flatten().find_map(|p| {
            let named = p.name.as_deref() == Some(wanted_port);
            let same_protocol = p.protocol.as_deref().unwrap_or("TCP") == protocol;
            let port = p
                .port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n != 0)?;
            (named && same_protocol).then_some(port)
        }) else {
            continue;
        };
        for ep in slice.endpoints.iter().flatten() {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let Some(node) = ep.node_name.as_deref() else {
                continue;
            };
            let Some(address) = ep
                .addresses
                .first()
                .and_then(|a| a.parse::<Ipv4Addr>().ok())
            else {
                continue;
            };
            if !ready {
                continue;
            }
            // `accepting` is sorted by name: a search, not a walk over a large class.
            let rank = accepting.binary_search(&node).unwrap_or(accepting.len());
            let pod = ep.target_ref.as_ref().and_then(|t| t.name.as_deref());
            let candidate = (rank, pod, node, address, pod_port);
            if best.as_ref().is_none_or(|b| candidate < *b) {
                best = Some(candidate);
            }
        }
    }
    best.map(|(_, pod, node, address, port)| ChosenEndpoint {
        node: node.to_owned(),
        address,
        port,
        pod: pod.map(str::to_owned),
    })
}
