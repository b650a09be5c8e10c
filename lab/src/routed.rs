//! The throughput bench's baseline: the same hops as a cross-node mapping (internet client →
//! router → edge → mesh → worker → pod) plainly routed, without kuport. Comparing the mapping
//! with it isolates what kuport itself costs; comparing with the raw mesh (one socket pair over
//! `wt0`) also charges the mapping for the client, router and pod namespaces, which on two
//! shared cores cost more than kuport does.
//!
//! The client dials the pod's own address on a port no mapping uses, so none of kuport's rules
//! (they match the edge's public address or the link's, and the mapped ports) can touch it. The
//! set-up is ordinary routes and WireGuard AllowedIPs, each recorded before it is made and
//! removed by name afterwards, also when the bench fails half-way.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use anyhow::{Context, Result, bail};
use kuport_core::ir::{LINK_PREFIX, TABLE};
use serde_json::Value;

use crate::runner::Runner;
use crate::scenario::Protocol;
use crate::sys::{exec, ip_in};
use crate::topology::{self, CLIENT_IP, CLIENT_NS, INET_NS};

/// The port of the baseline's listener in the pod: the bench's mappings use 3000–3300 and the
/// raw mesh sample 7000.
pub const PORT: u16 = 7001;

/// How the edge and the pod's node carry the routed path between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Plainly over `wt0`: the client's and the pod's addresses inside WireGuard.
    Mesh,
    /// Over a plain VXLAN link inside `wt0`, as kuport's return link is, with ordinary routes
    /// and no kuport rule: what the encapsulation costs by itself.
    Vxlan,
}

/// The plain VXLAN link of [`Via::Vxlan`]: its name (not `kup-`, so no kuport code or counter
/// takes it for one of its own), VNI, UDP port and /30.
const VXLAN_LINK: &str = "kbv-bench";
const VXLAN_VNI: &str = "4242";
const VXLAN_PORT: &str = "4799";
const VXLAN_EDGE: Ipv4Addr = Ipv4Addr::new(169, 254, 99, 1);
const VXLAN_WORKER: Ipv4Addr = Ipv4Addr::new(169, 254, 99, 2);

/// Something the set-up changed, undone by name.
enum Undo {
    Link {
        ns: String,
        name: String,
    },
    Route {
        ns: String,
        spec: String,
    },
    AllowedIp {
        pid: i32,
        peer: String,
        cidr: String,
    },
    Process(i32),
}

/// The routed path while it exists: what to dial and where to look for its traffic.
pub struct RoutedPath {
    undo: Vec<Undo>,
    /// `<pod address>:PORT`.
    pub target: String,
    edge_ns: String,
    worker_ns: String,
    /// The two routes into the mesh (edge → pod, worker → client), as `ip route` specs.
    mesh_routes: Vec<(String, String)>,
}

/// Bytes and packet counts that tell which way a transfer went.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// The worker's `wt0`, received and sent: every path in the bench crosses it.
    worker_wt0_rx: u64,
    worker_wt0_tx: u64,
    /// The edge's kuport links (`kup-*`), both ways: only the mapping uses them.
    edge_links: u64,
    /// Every packet counter of kuport's nft table on the edge and the worker, by namespace and
    /// counter (or rule): the routed path must never match a kuport rule.
    kuport_packets: BTreeMap<String, u64>,
}

impl RoutedPath {
    /// Builds the path to `pod` (namespace/name) through `edge`: a listener in the pod, routes
    /// on the router, the edge and the pod's node, and the two AllowedIPs WireGuard needs to
    /// carry the client's and the pod's addresses between the edge and the node. Then checks
    /// with `ip route get` that every hop goes the intended way.
    pub fn build(runner: &mut Runner<'_>, edge: &str, pod: &str, via: Via) -> Result<Self> {
        let p = runner
            .topo
            .pods
            .get(pod)
            .with_context(|| format!("no pod {pod}"))?
            .clone();
        let edge_node = runner.topo.node(edge)?.clone();
        let worker_node = runner.topo.node(&p.node)?.clone();
        let edge_public = edge_node
            .public
            .with_context(|| format!("{edge} has no public address"))?;
        let mut path = Self {
            undo: Vec::new(),
            target: format!("{}:{PORT}", p.ip),
            edge_ns: edge_node.ns.clone(),
            worker_ns: worker_node.ns.clone(),
            mesh_routes: Vec::new(),
        };
        let nodes = (&edge_node, &worker_node);
        let built = path.add(runner, via, &p.ns, p.ip, edge_public, nodes);
        if let Err(e) = built {
            let left = path.remove(runner);
            if !left.is_empty() {
                return Err(e.context(format!(
                    "and removing the half-built path left {}",
                    left.join(", ")
                )));
            }
            return Err(e);
        }
        Ok(path)
    }

    /// The listener in the pod, the router's route to the pod's address through the edge (as
    /// an upstream router sends a routed prefix to a site), then the mesh part `via` says, and
    /// a check of every hop both ways.
    fn add(
        &mut self,
        runner: &mut Runner<'_>,
        via: Via,
        pod_ns: &str,
        pod_ip: Ipv4Addr,
        edge_public: Ipv4Addr,
        (edge, worker): (&topology::NodeInfo, &topology::NodeInfo),
    ) -> Result<()> {
        self.listen(runner, pod_ns)?;
        self.route(INET_NS, &format!("{pod_ip}/32 via {edge_public}"))?;
        let device = match via {
            Via::Mesh => self.over_mesh(runner, pod_ip, edge, worker)?,
            Via::Vxlan => self.over_vxlan(pod_ip, edge, worker)?,
        };
        check_routes(pod_ip, edge_public, edge, worker, device)
    }

    /// The edge sends the pod's address into the mesh, not the CNI's VXLAN tunnel (its /24
    /// route): the mapping's link runs over wt0 too, so both paths cross the same userspace
    /// WireGuard. The node's own default leads to a dead-end gateway, so the client is reached
    /// back through the edge, over the mesh. Returns the device the two routes use.
    fn over_mesh(
        &mut self,
        runner: &Runner<'_>,
        pod_ip: Ipv4Addr,
        edge: &topology::NodeInfo,
        worker: &topology::NodeInfo,
    ) -> Result<&'static str> {
        self.mesh_route(&edge.ns, format!("{pod_ip}/32 dev wt0"))?;
        self.mesh_route(&worker.ns, format!("{CLIENT_IP}/32 dev wt0"))?;
        // WireGuard sends only to a peer that allows the destination and accepts only sources
        // the sending peer is allowed: the pod's address from the node, the client's from the
        // edge.
        let edge_member = runner.topo.mesh_member(&edge.name)?.clone();
        let worker_member = runner.topo.mesh_member(&worker.name)?.clone();
        self.allow(
            edge_member.wg_pid,
            &worker_member.public_key,
            &format!("{pod_ip}/32"),
        )?;
        self.allow(
            worker_member.wg_pid,
            &edge_member.public_key,
            &format!("{CLIENT_IP}/32"),
        )?;
        Ok("wt0")
    }

    /// A plain VXLAN link between the edge and the pod's node inside `wt0` (the mesh carries
    /// only the two nodes' own addresses, as for kuport's link) and routes over it both ways,
    /// no AllowedIPs: the baseline for what the encapsulation costs alone. Returns the link.
    fn over_vxlan(
        &mut self,
        pod_ip: Ipv4Addr,
        edge: &topology::NodeInfo,
        worker: &topology::NodeInfo,
    ) -> Result<&'static str> {
        for (node, peer, address) in [(edge, worker, VXLAN_EDGE), (worker, edge, VXLAN_WORKER)] {
            self.undo.push(Undo::Link {
                ns: node.ns.clone(),
                name: VXLAN_LINK.to_string(),
            });
            ip_in(
                &node.ns,
                &format!(
                    "link add {VXLAN_LINK} type vxlan id {VXLAN_VNI} local {} remote {} dstport {VXLAN_PORT} dev wt0 nolearning",
                    node.mesh, peer.mesh
                ),
            )?;
            ip_in(&node.ns, &format!("addr add {address}/30 dev {VXLAN_LINK}"))?;
            ip_in(&node.ns, &format!("link set {VXLAN_LINK} up"))?;
        }
        self.mesh_route(
            &edge.ns,
            format!("{pod_ip}/32 via {VXLAN_WORKER} dev {VXLAN_LINK}"),
        )?;
        self.mesh_route(
            &worker.ns,
            format!("{CLIENT_IP}/32 via {VXLAN_EDGE} dev {VXLAN_LINK}"),
        )?;
        Ok(VXLAN_LINK)
    }

    /// A route between the edge and the pod's node, remembered for [`Self::lock_mtu`].
    fn mesh_route(&mut self, ns: &str, spec: String) -> Result<()> {
        self.route(ns, &spec)?;
        self.mesh_routes.push((ns.to_owned(), spec));
        Ok(())
    }

    /// The listener in the pod.
    fn listen(&mut self, runner: &mut Runner<'_>, pod_ns: &str) -> Result<()> {
        let pid = topology::spawn_echo(
            runner.lab,
            &runner.topo,
            pod_ns,
            "routed-baseline-tcp",
            Protocol::Tcp,
            &PORT.to_string(),
            "routed-baseline",
        )?;
        self.undo.push(Undo::Process(pid));
        Ok(())
    }

    fn route(&mut self, ns: &str, spec: &str) -> Result<()> {
        self.undo.push(Undo::Route {
            ns: ns.to_string(),
            spec: spec.to_string(),
        });
        ip_in(ns, &format!("route add {spec}"))?;
        Ok(())
    }

    /// Locks the MTU of the two routes into the mesh to `mtu`: the routed path then carries
    /// packets no larger than the mapping's return link does (path MTU discovery lowers the
    /// ends' segments), which separates the cost of the link's smaller packets from the rest.
    /// Only lowered, never raised again: the ends keep what path MTU discovery taught them.
    pub fn lock_mtu(&self, mtu: u32) -> Result<()> {
        for (ns, spec) in &self.mesh_routes {
            ip_in(ns, &format!("route replace {spec} mtu lock {mtu}"))?;
        }
        Ok(())
    }

    /// Adds `cidr` to a peer's AllowedIPs (wg sets the whole list, so it is read first).
    fn allow(&mut self, pid: i32, peer: &str, cidr: &str) -> Result<()> {
        self.undo.push(Undo::AllowedIp {
            pid,
            peer: peer.to_string(),
            cidr: cidr.to_string(),
        });
        let mut list = allowed_ips(pid, peer)?;
        if !list.iter().any(|c| c == cidr) {
            list.push(cidr.to_string());
        }
        set_allowed_ips(pid, peer, &list)
    }

    /// Undoes everything, newest first, whatever fails on the way. Returns what is left.
    pub fn remove(&mut self, runner: &mut Runner<'_>) -> Vec<String> {
        let mut left = Vec::new();
        while let Some(u) = self.undo.pop() {
            let (what, r) = match u {
                Undo::Link { ns, name } => (
                    format!("link {name} in {ns}"),
                    ip_in(&ns, &format!("link del {name}")).map(drop),
                ),
                Undo::Route { ns, spec } => (
                    format!("route {spec} in {ns}"),
                    ip_in(&ns, &format!("route del {spec}")).map(drop),
                ),
                Undo::AllowedIp { pid, peer, cidr } => (
                    format!("AllowedIP {cidr} of a peer of wireguard-go {pid}"),
                    allowed_ips(pid, &peer).and_then(|list| {
                        let rest: Vec<String> = list.into_iter().filter(|c| *c != cidr).collect();
                        set_allowed_ips(pid, &peer, &rest)
                    }),
                ),
                Undo::Process(pid) => (
                    format!("the baseline listener (pid {pid})"),
                    runner.lab.stop(
                        pid,
                        rustix::process::Signal::TERM,
                        std::time::Duration::from_secs(2),
                    ),
                ),
            };
            if let Err(e) = r {
                left.push(format!("{what} ({e:#})"));
            }
        }
        left
    }

    pub fn counters(&self) -> Result<Counters> {
        let (worker_wt0_rx, worker_wt0_tx) = link_bytes(&self.worker_ns, |n| n == "wt0")?;
        let (link_rx, link_tx) = link_bytes(&self.edge_ns, |n| n.starts_with(LINK_PREFIX))?;
        Ok(Counters {
            worker_wt0_rx,
            worker_wt0_tx,
            edge_links: link_rx + link_tx,
            kuport_packets: kuport_packets(&self.edge_ns)?
                .into_iter()
                .chain(kuport_packets(&self.worker_ns)?)
                .collect(),
        })
    }
}

impl Counters {
    /// Checks that a transfer of `bytes` each way between `before` and `self` went over the
    /// worker's wt0 and, when `mapped`, through kuport's link, otherwise past kuport entirely.
    pub fn check_since(&self, before: &Self, bytes: u64, mapped: bool) -> Result<()> {
        let rx = self.worker_wt0_rx.saturating_sub(before.worker_wt0_rx);
        let tx = self.worker_wt0_tx.saturating_sub(before.worker_wt0_tx);
        let links = self.edge_links.saturating_sub(before.edge_links);
        let moved: Vec<String> = self
            .kuport_packets
            .iter()
            // A rule that matches only packets on kuport's own links counts the links' probes
            // (every 2 s); the link bytes above already say the baseline never used a link.
            .filter(|(k, _)| !on_a_link(k))
            .filter_map(|(k, n)| {
                let d = n.saturating_sub(before.kuport_packets.get(k).copied().unwrap_or(0));
                (d > 0).then(|| format!("{k}: {d}"))
            })
            .collect();
        let kuport = moved.len();
        let what = if mapped { "mapping" } else { "routed baseline" };
        if rx < bytes || tx < bytes {
            bail!(
                "{what}: the worker's wt0 carried {rx} bytes in and {tx} out, not {bytes} each way"
            );
        }
        if mapped && links < 2 * bytes {
            bail!("mapping: the edge's kuport links carried {links} bytes, not {bytes} each way");
        }
        // The links carry the mapping's probes only, so a transfer of the routed path leaves
        // them idle (a few keepalive-sized bytes at most), and no kuport rule counts a packet.
        if !mapped && (links > bytes / 100 || kuport > 0) {
            bail!(
                "routed baseline: kuport saw the transfer ({links} bytes on the edge's links; {kuport} of its counters moved: {})",
                moved.join("; ")
            );
        }
        Ok(())
    }
}

fn allowed_ips(pid: i32, peer: &str) -> Result<Vec<String>> {
    let out = topology::wg(pid, &["show", "wt0", "allowed-ips"])?;
    let line = out
        .lines()
        .find(|l| l.starts_with(peer))
        .with_context(|| format!("wireguard-go {pid} has no peer {peer}"))?;
    Ok(line
        .split_whitespace()
        .skip(1)
        .filter(|c| *c != "(none)")
        .map(str::to_string)
        .collect())
}

fn set_allowed_ips(pid: i32, peer: &str, list: &[String]) -> Result<()> {
    let joined = list.join(",");
    topology::wg(pid, &["set", "wt0", "peer", peer, "allowed-ips", &joined])?;
    Ok(())
}

/// Received and sent bytes summed over the links of `ns` whose name passes `pick`.
fn link_bytes(ns: &str, pick: impl Fn(&str) -> bool) -> Result<(u64, u64)> {
    let text = ip_in(ns, "-s -j link show")?;
    let links: Vec<Value> = serde_json::from_str(&text).context("reading `ip -s -j link`")?;
    let mut sum = (0, 0);
    for l in links {
        if l.get("ifname").and_then(Value::as_str).is_some_and(&pick) {
            let get = |dir: &str| {
                l.pointer(&format!("/stats64/{dir}/bytes"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            };
            sum.0 += get("rx");
            sum.1 += get("tx");
        }
    }
    Ok(sum)
}

/// The packets every counter of kuport's nft table in `ns` has counted. A missing table is an
/// error: it would make "no kuport rule matched" true for the wrong reason.
fn kuport_packets(ns: &str) -> Result<BTreeMap<String, u64>> {
    let text = exec(ns, "nft", &["list", "table", "ip", TABLE])
        .with_context(|| format!("listing kuport's table in {ns}"))?;
    Ok(packet_counts(ns, &text))
}

/// Whether a counted rule matches only packets entering or leaving one of kuport's links.
fn on_a_link(rule: &str) -> bool {
    ["iifname", "oifname"]
        .iter()
        .any(|m| rule.contains(&format!("{m} \"{LINK_PREFIX}")))
}

/// The packet count of every counter in an `nft list table` text, keyed by `ns` and the named
/// counter or, for a rule's own counter, the rule without its numbers.
fn packet_counts(ns: &str, text: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let mut named: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line
            .strip_prefix("counter ")
            .and_then(|l| l.strip_suffix(" {"))
        {
            named = Some(name.to_owned());
            continue;
        }
        let Some((before, after)) = line.split_once("packets ") else {
            continue;
        };
        let packets = after
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let key = match named.take() {
            Some(name) if before.is_empty() => format!("{ns}: counter {name}"),
            _ => format!("{ns}: {}", before.trim_end()),
        };
        *counts.entry(key).or_insert(0) += packets;
    }
    counts
}

/// The MTU kuport gave its return link on the edge (the first `kup-*` link): what the mapping's
/// packets are limited to.
pub fn edge_link_mtu(path: &RoutedPath) -> Result<u32> {
    let text = ip_in(&path.edge_ns, "-j link show")?;
    let links: Vec<Value> = serde_json::from_str(&text).context("reading `ip -j link`")?;
    links
        .iter()
        .filter(|l| {
            l.get("ifname")
                .and_then(Value::as_str)
                .is_some_and(|n| n.starts_with(LINK_PREFIX))
        })
        .find_map(|l| l.get("mtu").and_then(Value::as_u64))
        .and_then(|m| u32::try_from(m).ok())
        .with_context(|| format!("no kuport link with an MTU in {}", path.edge_ns))
}

/// Both directions of the routed path, hop by hop, as `ip route get` resolves them.
fn check_routes(
    pod_ip: Ipv4Addr,
    edge_public: Ipv4Addr,
    edge: &topology::NodeInfo,
    worker: &topology::NodeInfo,
    mesh: &str,
) -> Result<()> {
    // Both directions, hop by hop: the client's default, the router's new route, the
    // edge into the mesh, the node to the pod (the bench's CNI is Cilium's shape, pods
    // behind cilium_host), and the answer back the same way.
    let (edge_ns, edge_if) = (edge.ns.as_str(), "enp1s0");
    let expect: [(&str, String, String); 6] = [
        (
            CLIENT_NS,
            format!("{pod_ip}"),
            "via 198.51.100.1 dev c0".into(),
        ),
        (
            INET_NS,
            format!("{pod_ip} from {CLIENT_IP} iif cli0"),
            format!("via {edge_public} dev pub0"),
        ),
        (
            edge_ns,
            format!("{pod_ip} from {CLIENT_IP} iif {}", edge_if),
            format!("dev {mesh}"),
        ),
        (
            &worker.ns,
            format!("{pod_ip} from {CLIENT_IP} iif {mesh}"),
            "dev cilium_host".into(),
        ),
        (
            &worker.ns,
            format!("{CLIENT_IP} from {pod_ip} iif cilium_host"),
            format!("dev {mesh}"),
        ),
        (
            edge_ns,
            format!("{CLIENT_IP} from {pod_ip} iif {mesh}"),
            format!("dev {}", edge_if),
        ),
    ];
    for (ns, query, want) in expect {
        let got = ip_in(ns, &format!("route get {query}"))?;
        if !got.contains(&want) {
            bail!("routed baseline: in {ns}, `ip route get {query}` gives {got:?}, not {want:?}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_counts_name_each_counter_and_each_rule_with_one() {
        let text = "table ip kuport {\n\tcounter pm-games-a {\n\t\tpackets 3 bytes 120\n\t}\n\tchain kup-pre {\n\t\tip daddr 10.0.0.1 counter packets 7 bytes 400 drop\n\t\tudp dport 4789 accept\n\t}\n}\n";
        assert!(on_a_link(
            "kl-worker-b: iifname \"kup-dcc4266d\" ct direction original counter"
        ));
        assert!(!on_a_link("edge: ip daddr 10.0.0.1 counter"));
        let counts = packet_counts("edge", text);
        assert_eq!(
            counts,
            BTreeMap::from([
                ("edge: counter pm-games-a".to_owned(), 3),
                ("edge: ip daddr 10.0.0.1 counter".to_owned(), 7),
            ])
        );
    }
}
