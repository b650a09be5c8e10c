//! What else on a node takes traffic for a port: host sockets, NodePorts and hostPorts.
//!
//! kube-proxy's NodePorts (in every mode) and the CNI portmap plugin's hostPorts are DNAT rules,
//! not sockets, so the host's socket table never shows them, and kuport's steering (before any
//! NAT) would take their traffic. They are read from the API instead: NodePorts from the
//! Services (every node serves them), hostPorts from the Pods bound to the node. An accepting
//! node reports every holder of a port some PortMap asks for in its class row, as it reports
//! sockets, so every agent's admission agrees.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::{Pod, Service};

use crate::api::Protocol;
use crate::snapshot::{HostFacts, HostSocket};

/// One thing on a node that takes traffic for a port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    pub protocol: Protocol,
    pub port: u16,
    /// `0.0.0.0` for every address of the node (both families), else one address.
    pub address: IpAddr,
    /// Who holds it, as a status shows it.
    pub holder: String,
}

/// The NodePorts of every Service (a `nodePort` of any port, and the health-check NodePort of a
/// LoadBalancer with `externalTrafficPolicy: Local`), held on every address of every node,
/// sorted.
pub fn node_ports(services: &[Service]) -> Vec<Holder> {
    let mut held: Vec<Holder> = services
        .iter()
        .filter_map(|svc| {
            let name = format!(
                "{}/{}",
                svc.metadata.namespace.as_deref().unwrap_or_default(),
                svc.metadata.name.as_deref()?
            );
            Some((name, svc.spec.as_ref()?))
        })
        .flat_map(|(name, spec)| {
            let ports = spec.ports.iter().flatten().filter_map({
                let name = name.clone();
                move |p| {
                    Some(Holder {
                        protocol: protocol(p.protocol.as_deref())?,
                        port: port(p.node_port)?,
                        address: ANY,
                        holder: format!("NodePort of Service {name}"),
                    })
                }
            });
            // kube-proxy listens on it with a socket too, but only on nodes running it.
            let health = port(spec.health_check_node_port).map(|port| Holder {
                protocol: Protocol::Tcp,
                port,
                address: ANY,
                holder: format!("health-check NodePort of Service {name}"),
            });
            ports.chain(health)
        })
        .collect();
    held.sort();
    held.dedup();
    held
}

/// Every address of the node, in both families.
const ANY: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// `::` holds every address as `0.0.0.0` does: one spelling, so the two compare equal.
fn any_if_unspecified(addr: IpAddr) -> IpAddr {
    if addr.is_unspecified() { ANY } else { addr }
}

/// The hostPorts of the Pods bound to each node (not yet finished), by node, each sorted. A
/// `hostIP` holds the port on that address only (IPv4 or IPv6).
pub fn host_ports(pods: &[Pod]) -> BTreeMap<&str, Vec<Holder>> {
    let mut by_node: BTreeMap<&str, Vec<Holder>> = BTreeMap::new();
    for pod in pods {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        if finished {
            continue;
        }
        let name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let containers = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten());
        let held = containers
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let address = match p.host_ip.as_deref().map(str::trim) {
                    None | Some("") => ANY,
                    Some(ip) => any_if_unspecified(ip.parse().ok()?),
                };
                Some(Holder {
                    protocol: protocol(p.protocol.as_deref())?,
                    port: port(p.host_port)?,
                    address,
                    holder: format!("hostPort of Pod {name}"),
                })
            });
        by_node.entry(node).or_default().extend(held);
    }
    for held in by_node.values_mut() {
        held.sort();
        held.dedup();
    }
    by_node.retain(|_, held| !held.is_empty());
    by_node
}

/// Everything that holds a port on `node`: its host sockets (from its own facts), its Pods'
/// hostPorts and every NodePort, sorted.
pub fn on_node(
    node_ports: &[Holder],
    host_ports: &BTreeMap<&str, Vec<Holder>>,
    node: &str,
    facts: &HostFacts,
) -> Vec<Holder> {
    let mut held: Vec<Holder> = facts
        .sockets
        .iter()
        .map(socket)
        .chain(host_ports.get(node).into_iter().flatten().cloned())
        .chain(node_ports.iter().cloned())
        .collect();
    held.sort();
    held.dedup();
    held
}

fn socket(s: &HostSocket) -> Holder {
    let bound = SocketAddr::new(s.address, s.port);
    let holder = s.holder.clone().unwrap_or_else(|| match s.protocol {
        Protocol::Tcp => format!("host TCP listener {bound}"),
        Protocol::Udp => format!("host UDP socket {bound}"),
    });
    Holder {
        protocol: s.protocol,
        port: s.port,
        address: any_if_unspecified(s.address),
        holder,
    }
}

/// TCP (the API's default) or UDP; SCTP and anything else hold nothing kuport maps.
fn protocol(p: Option<&str>) -> Option<Protocol> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        _ => None,
    }
}

fn port(p: Option<i32>) -> Option<u16> {
    p.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0)
}
