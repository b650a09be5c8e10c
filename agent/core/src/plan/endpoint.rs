//! Endpoint choice: one pod per mapping, identical on every agent.

use std::net::Ipv4Addr;

use super::ChosenEndpoint;
use super::index::Index;
use crate::api::PortMap;

/// A ready endpoint as it ranks: (node's rank among the accepting nodes, pod name, node name,
/// address, pod port). The smallest is chosen.
type Candidate<'a> = (usize, Option<&'a str>, &'a str, Ipv4Addr, u16);

/// The endpoint of `pm`: among ready IPv4 endpoints listing the named port with the mapping's
/// protocol, sorted by (a) the node's rank among the accepting nodes (others after them),
/// (b) the pod name, (c) the node name, (d) the address. `accepting` is sorted by name.
pub fn choose(index: &Index, pm: &PortMap, accepting: &[&str]) -> Option<ChosenEndpoint> {
    let (_, pod, node, address, port) = candidates(index, pm, accepting).min()?;
    Some(ChosenEndpoint {
        node: node.to_owned(),
        address,
        port,
        pod: pod.map(str::to_owned),
    })
}

/// The nodes the endpoint would move to next, in the order [`choose`] ranks endpoints: the
/// nodes of the other ready endpoints, each once, leaving out `exclude`, at most `limit`.
pub fn next_nodes<'a>(
    index: &Index<'a>,
    pm: &'a PortMap,
    accepting: &[&str],
    exclude: &[&str],
    limit: usize,
) -> Vec<&'a str> {
    let mut ranked: Vec<Candidate<'a>> = candidates(index, pm, accepting).collect();
    ranked.sort_unstable();
    let mut nodes: Vec<&'a str> = Vec::new();
    for (_, _, node, _, _) in ranked {
        if nodes.len() == limit {
            break;
        }
        if !exclude.contains(&node) && !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    nodes
}

/// Every ready IPv4 endpoint of the mapping's Service that lists its named port with its
/// protocol, ranked.
fn candidates<'a>(
    index: &Index<'a>,
    pm: &'a PortMap,
    accepting: &[&str],
) -> impl Iterator<Item = Candidate<'a>> {
    let namespace = pm.metadata.namespace.as_deref().unwrap_or_default();
    let service = pm.spec.service_ref.name.as_str();
    let wanted_port = pm.spec.service_ref.port.as_str();
    let protocol = pm.spec.protocol.as_str();
    index
        .slices
        .get(&(namespace, service))
        .into_iter()
        .flatten()
        .copied()
        .filter(|slice| slice.address_type == "IPv4")
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
        .flat_map(move |(slice, pod_port)| {
            slice.endpoints.iter().flatten().filter_map(move |ep| {
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                let node = ep.node_name.as_deref()?;
                let address = ep
                    .addresses
                    .first()
                    .and_then(|a| a.parse::<Ipv4Addr>().ok())?;
                if !ready {
                    return None;
                }
                // `accepting` is sorted by name: a search, not a walk over a large class.
                let rank = accepting.binary_search(&node).unwrap_or(accepting.len());
                let pod = ep.target_ref.as_ref().and_then(|t| t.name.as_deref());
                Some((rank, pod, node, address, pod_port))
            })
        })
}
