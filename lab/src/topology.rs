//! The fake cluster's network: underlay bridge, WireGuard mesh, internet side, CNI emulation and
//! pods, all as network namespaces. Addresses come from documentation ranges (IPv4 and IPv6) and
//! the IPv6 unique local range only. Every element but the mesh (unless `mesh: {ipv6: true}`)
//! and the VPN clients has an IPv6 address beside its IPv4 one (an IPv6 address's last groups
//! read like its IPv4 twin's last octets, written as hexadecimal: 2001:db8:203::10 is not ::a).
//!
//! | what                | namespace         | IPv4                                        | IPv6 |
//! |---------------------|-------------------|---------------------------------------------|------|
//! | underlay bridge     | `kl-ul`           | `br0` 192.0.2.254/24 (API server, dead-end gateway) | `br0` 2001:db8:192::fe/64 (dead-end gateway) |
//! | node i (1-based)    | `kl-<node>`       | `ul0` 192.0.2.i, `wt0` 100.64.0.i/16, pods 10.244.i.0/24 (gateway 10.244.i.1), `enp1s0` 203.0.113.i | `ul0` 2001:db8:192::i/64, pods fd00:10:244:i::/64 (gateway fd00:10:244:i::1), `enp1s0` 2001:db8:203::i/64; `wt0` fd00:100:64::i/64 only under `mesh: {ipv6: true}` |
//! | VPN client j        | `kl-vpn-<name>`   | `ul0` 192.0.2.(100+j), `wt0` 100.64.1.j/16   | `wt0` fd00:100:64::1:j/64 under `mesh: {ipv6: true}`, else none (IPv6 off) |
//! | internet router     | `kl-inet`         | 198.51.100.1/24, 203.0.113.254/24            | 2001:db8:198::1/64, 2001:db8:203::fe/64 |
//! | internet client     | `kl-client`       | 198.51.100.10                                | 2001:db8:198::10/64 |
//! | pod k               | `kl-pod-<k>`      | 10.244.i.(9+k)                               | fd00:10:244:i::(9+k) |
//!
//! IPv6 is on in every namespace but the VPN clients' off a dual-stack mesh (`Lab::add_namespace`
//! turns it off), with
//! duplicate address detection, router advertisements and autoconf off, so every address is
//! usable at once and none appears by itself; nodes and the router forward IPv6.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kuport_core::ir::{LINK_PREFIX, PREF_LOOP_GUARD, PREF_REPLY, TABLE};

use crate::scenario::{Cni, Firewall, IpFamily, NodeSpec, PodSpec, Protocol, RpFilter, Scenario};
use crate::sys::{self, Lab, exec, ip, ip_in, ip_line, sh};

pub const UL_NS: &str = "kl-ul";
pub const INET_NS: &str = "kl-inet";
pub const CLIENT_NS: &str = "kl-client";
pub const API_ADDR: &str = "192.0.2.254:6443";
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// The internet client's IPv6 address, 2001:db8:198::10.
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x198, 0, 0, 0, 0, 0x10);
/// The internet router's IPv6 address on the public segment (the public nodes' gateway).
pub const ROUTER_PUBLIC6: &str = "2001:db8:203::fe";
/// Every node's IPv6 pod prefix lies in this one (node i: fd00:10:244:i::/64).
pub const POD_SUPERNET6: &str = "fd00:10:244::/48";
/// netbird marks its own WireGuard packets with this and keeps them out of its table.
pub const MESH_FWMARK: &str = "0x1bd00";
pub const MESH_TABLE: &str = "7120";
pub const MESH_PREFIX: &str = "100.64.0.0/16";
/// The mesh's IPv6 prefix under `mesh: {ipv6: true}`.
pub const MESH_PREFIX6: &str = "fd00:100:64::/64";
/// A node's mesh IPv6 address is this and its index.
const MESH_PREFIX6_BASE: &str = "fd00:100:64::";
pub const MESH_MTU: &str = "1420";

#[derive(Clone, Debug)]
pub struct MeshMember {
    pub name: String,
    pub ns: String,
    pub underlay: Ipv4Addr,
    pub mesh: Ipv4Addr,
    /// Its mesh IPv6 address, under `mesh: {ipv6: true}` (nodes only).
    pub mesh6: Option<Ipv6Addr>,
    /// The pod CIDR WireGuard also allows from this peer (native routing), if any.
    pub pod_cidr: Option<String>,
    /// Its IPv6 pod prefix, allowed the same way (the tunnel is IPv4, its inner packets not).
    pub pod_cidr6: Option<String>,
    pub wg_pid: i32,
    pub key: PathBuf,
    pub public_key: String,
    pub is_node: bool,
}

#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub name: String,
    pub ns: String,
    pub index: u8,
    pub public: Option<Ipv4Addr>,
    pub mesh: Ipv4Addr,
    /// `wt0`'s IPv6 address (fd00:100:64::i), under `mesh: {ipv6: true}`.
    pub mesh6: Option<Ipv6Addr>,
    pub pod_cidr: String,
    pub pod_gateway: Ipv4Addr,
    /// `enp1s0`'s IPv6 address (2001:db8:203::i), when public.
    pub public6: Option<Ipv6Addr>,
    /// The IPv6 pod prefix, fd00:10:244:i::/64.
    pub pod_cidr6: String,
    /// The node's IPv6 address on its pod network, fd00:10:244:i::1.
    pub pod_gateway6: Ipv6Addr,
}

/// A Node's InternalIPs: the mesh's IPv4 address and its IPv6 one (on an IPv6 mesh), each
/// unless the scenario leaves that family out of the node's `internalIpFamilies`.
pub type NodeIps = (Option<Ipv4Addr>, Option<Ipv6Addr>);

#[derive(Clone, Debug)]
pub struct PodInfo {
    pub spec: PodSpec,
    pub ns: String,
    pub ip: Ipv4Addr,
    /// Its IPv6 address: fd00:10:244:i::h for 10.244.i.h (every pod has one, whatever its
    /// Service's families).
    pub ip6: Ipv6Addr,
    pub node: String,
    pub ready: bool,
    /// Responders by (protocol, first port), with their pids.
    pub responders: BTreeMap<(Protocol, u16), i32>,
}

pub struct Topology {
    pub scenario: Scenario,
    pub nodes: Vec<NodeInfo>,
    pub mesh: Vec<MeshMember>,
    pub pods: BTreeMap<String, PodInfo>,
    pub bins: PathBuf,
    pub kubeconfig: PathBuf,
    pub api_pid: Option<i32>,
    pub agents: BTreeMap<String, i32>,
    next_pod: u16,
    key_dir: PathBuf,
}

impl Topology {
    pub fn node(&self, name: &str) -> Result<&NodeInfo> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name} in this scenario"))
    }

    /// The InternalIPs `node`'s Node lists: its mesh addresses, of the families its spec's
    /// `internalIpFamilies` names (every family its `wt0` has when it names none).
    pub fn internal_ips(&self, node: &NodeInfo) -> NodeIps {
        let families = self
            .scenario
            .nodes
            .iter()
            .find(|n| n.name == node.name)
            .map(|n| n.internal_ip_families.as_slice())
            .unwrap_or_default();
        let listed = |f: IpFamily| families.is_empty() || families.contains(&f);
        (
            listed(IpFamily::IPv4).then_some(node.mesh),
            node.mesh6.filter(|_| listed(IpFamily::IPv6)),
        )
    }

    pub fn mesh_member(&self, name: &str) -> Result<&MeshMember> {
        self.mesh
            .iter()
            .find(|m| m.name == name)
            .with_context(|| format!("no mesh member {name}"))
    }

    /// The address a client dials for `node`'s `interface`.
    pub fn address_of(&self, node: &str, interface: &str) -> Result<Ipv4Addr> {
        let n = self.node(node)?;
        match interface {
            "enp1s0" => n
                .public
                .with_context(|| format!("node {node} is not public (no enp1s0)")),
            "wt0" => Ok(n.mesh),
            other => bail!("the lab gives nodes enp1s0 and wt0, not {other}"),
        }
    }

    /// The address a client dials for `node`'s `interface` in `family` (`wt0` is IPv4 only).
    pub fn address_in(&self, node: &str, interface: &str, family: IpFamily) -> Result<IpAddr> {
        if family == IpFamily::IPv4 {
            return self.address_of(node, interface).map(IpAddr::V4);
        }
        let n = self.node(node)?;
        match interface {
            "enp1s0" => n
                .public6
                .map(IpAddr::V6)
                .with_context(|| format!("node {node} is not public (no enp1s0)")),
            "wt0" => n.mesh6.map(IpAddr::V6).with_context(|| {
                format!("the mesh (wt0) is IPv4 only here: no IPv6 address on {node}'s wt0 (`mesh: {{ipv6: true}}` gives it one)")
            }),
            other => bail!("the lab gives nodes enp1s0 and wt0, not {other}"),
        }
    }

    /// Whether any pod of the scenario is listed in an IPv6 slice (the cluster is then
    /// dual-stack to the API: its Nodes list their IPv6 pod prefix too).
    pub fn uses_ipv6(&self) -> bool {
        self.scenario
            .pods
            .iter()
            .any(|p| p.has_family(IpFamily::IPv6))
    }

    pub fn bin(&self, name: &str) -> String {
        self.bins.join(name).display().to_string()
    }
}

/// Builds the whole network of a scenario (no API server, no agents yet).
pub fn build(lab: &mut Lab, scenario: &Scenario, bins: &Path) -> Result<Topology> {
    build_network(lab, scenario, bins, true)
}

/// [`build`], with the CNI emulation left out when `emulate_cni` is false: the local cluster's
/// real Cilium makes its own devices, routes and masquerade (the mesh still carries the pod
/// ranges under native routing, as it does for the emulation).
pub fn build_network(
    lab: &mut Lab,
    scenario: &Scenario,
    bins: &Path,
    emulate_cni: bool,
) -> Result<Topology> {
    if !Path::new("/run/wireguard").exists() {
        std::fs::create_dir_all("/run/wireguard").context("creating /run/wireguard")?;
        lab.note_run_wireguard()?;
    }
    let key_dir = Path::new(sys::RUN_DIR).join("keys");
    sys::private_dir(&key_dir).context("creating the key directory")?;
    let mut topo = Topology {
        scenario: scenario.clone(),
        nodes: Vec::new(),
        mesh: Vec::new(),
        pods: BTreeMap::new(),
        bins: bins.to_path_buf(),
        kubeconfig: Path::new(sys::RUN_DIR).join("kubeconfig"),
        api_pid: None,
        agents: BTreeMap::new(),
        next_pod: 0,
        key_dir,
    };
    underlay(lab)?;
    internet(lab)?;
    let rp = match scenario.host.rp_filter {
        RpFilter::Loose => "2",
        RpFilter::Strict => "1",
    };
    for (i, spec) in scenario.nodes.iter().enumerate() {
        let index = u8::try_from(i + 1).context("too many nodes")?;
        add_node(lab, &mut topo, index, spec, rp, scenario.cni)?;
    }
    for (j, name) in scenario.vpn_clients.iter().enumerate() {
        let index = u8::try_from(j + 1).context("too many VPN clients")?;
        add_vpn_client(lab, &mut topo, index, name)?;
    }
    // Every member's private key is readable by root only, or the lab refuses to go on.
    let mut secrets: Vec<&Path> = vec![&topo.key_dir];
    secrets.extend(topo.mesh.iter().map(|m| m.key.as_path()));
    sys::check_private(&secrets)?;
    for member in topo.mesh.clone() {
        configure_mesh(&topo, &member)?;
    }
    for node in topo.nodes.clone() {
        if emulate_cni {
            cni(&topo, &node)?;
        }
        host_filters(&topo, &node)?;
    }
    check_mesh(&topo)?;
    Ok(topo)
}

/// Node `index` (from 1): its namespace with forwarding and the scenario's `rp_filter`, its
/// underlay port, its public port on the internet segment (or, for a worker, a default route
/// into the underlay), its WireGuard mesh member and its pod network.
fn add_node(
    lab: &mut Lab,
    topo: &mut Topology,
    index: u8,
    spec: &NodeSpec,
    rp: &str,
    cni_mode: Cni,
) -> Result<()> {
    let ns = format!("kl-{}", spec.name);
    lab.add_namespace(&ns)?;
    exec(
        &ns,
        "sysctl",
        &[
            "-qw",
            "net.ipv4.ip_forward=1",
            &format!("net.ipv4.conf.all.rp_filter={rp}"),
            &format!("net.ipv4.conf.default.rp_filter={rp}"),
        ],
    )?;
    enable_ipv6(&ns, true)?;
    let underlay_ip = Ipv4Addr::new(192, 0, 2, index);
    attach_underlay(&ns, &format!("u{index}"), underlay_ip)?;
    ip_in(
        &ns,
        &format!("addr add {} dev ul0 nodad", underlay6(index)?),
    )?;
    let public = spec.public.then(|| Ipv4Addr::new(203, 0, 113, index));
    let public6 = match public {
        Some(addr) => Some(add_public_port(&ns, index, addr)?),
        None => {
            // A worker's own egress: an underlay gateway that does not forward, so a reply
            // taking the wrong route is lost as on a real site (for IPv6 too).
            ip_in(&ns, "route add default via 192.0.2.254 dev ul0")?;
            ip_in(
                &ns,
                &format!("-6 route add default via {UNDERLAY_GW6} dev ul0"),
            )?;
            None
        }
    };
    let mesh = Ipv4Addr::new(100, 64, 0, index);
    let mesh6 = match topo.scenario.mesh.ipv6 {
        true => Some(mesh_address6(index)?),
        false => None,
    };
    let pod_cidr = format!("10.244.{index}.0/24");
    let wg_pid = start_wireguard(lab, &ns, &spec.name)?;
    let (key, public_key) = keypair(&topo.key_dir, &spec.name)?;
    topo.mesh.push(MeshMember {
        name: spec.name.clone(),
        ns: ns.clone(),
        underlay: underlay_ip,
        mesh,
        mesh6,
        pod_cidr: (cni_mode != Cni::CiliumTunnel).then(|| pod_cidr.clone()),
        pod_cidr6: (cni_mode != Cni::CiliumTunnel).then(|| format!("fd00:10:244:{index}::/64")),
        wg_pid,
        key,
        public_key,
        is_node: true,
    });
    topo.nodes.push(NodeInfo {
        name: spec.name.clone(),
        ns,
        index,
        public,
        mesh,
        mesh6,
        pod_cidr,
        pod_gateway: Ipv4Addr::new(10, 244, index, 1),
        public6,
        pod_cidr6: format!("fd00:10:244:{index}::/64"),
        pod_gateway6: pod_address6(index, 1)?,
    });

    Ok(())
}

/// Node `index`'s mesh IPv6 address, fd00:100:64::i (under `mesh: {ipv6: true}`).
fn mesh_address6(index: u8) -> Result<Ipv6Addr> {
    format!("{MESH_PREFIX6_BASE}{index}")
        .parse()
        .with_context(|| format!("the mesh IPv6 address of node {index}"))
}

/// VPN client `index`'s mesh IPv6 address, fd00:100:64::1:j, the twin of 100.64.1.j (under
/// `mesh: {ipv6: true}`).
fn vpn_mesh_address6(index: u8) -> Result<Ipv6Addr> {
    format!("{MESH_PREFIX6_BASE}1:{index}")
        .parse()
        .with_context(|| format!("the mesh IPv6 address of VPN client {index}"))
}

/// A public node's `enp1s0` on the internet segment: 203.0.113.i/24 and 2001:db8:203::i/64, each
/// family's default route via the internet router. Returns the IPv6 address.
fn add_public_port(ns: &str, index: u8, addr: Ipv4Addr) -> Result<Ipv6Addr> {
    let addr6: Ipv6Addr = format!("2001:db8:203::{index}")
        .parse()
        .context("a public IPv6 address")?;
    ip_line(&format!(
        "link add enp1s0 netns {ns} type veth peer name p{index} netns {INET_NS}"
    ))?;
    ip_in(INET_NS, &format!("link set p{index} master pub0 up"))?;
    ip_in(ns, &format!("addr add {addr}/24 dev enp1s0"))?;
    ip_in(ns, &format!("addr add {addr6}/64 dev enp1s0 nodad"))?;
    ip_in(ns, "link set enp1s0 up")?;
    ip_in(ns, "route add default via 203.0.113.254 dev enp1s0")?;
    ip_in(
        ns,
        &format!("-6 route add default via {ROUTER_PUBLIC6} dev enp1s0"),
    )?;
    Ok(addr6)
}

/// The underlay's IPv6 gateway (on `kl-ul`'s `br0`), which does not forward either.
const UNDERLAY_GW6: &str = "2001:db8:192::fe";

/// Node `index`'s IPv6 address on the underlay, with its prefix length.
fn underlay6(index: u8) -> Result<String> {
    let addr: Ipv6Addr = format!("2001:db8:192::{index}")
        .parse()
        .context("an underlay IPv6 address")?;
    Ok(format!("{addr}/64"))
}

/// Address `host` of node `index`'s IPv6 pod prefix, written as its IPv4 twin reads:
/// 10.244.i.h is fd00:10:244:i::h (the digits read as hexadecimal).
pub fn pod_address6(index: u8, host: u8) -> Result<Ipv6Addr> {
    format!("fd00:10:244:{index}::{host}")
        .parse()
        .with_context(|| format!("the IPv6 pod address {host} of node {index}"))
}

/// Turns IPv6 on in a namespace the lab made (`Lab::add_namespace` turns it off): no duplicate
/// address detection (addresses are usable at once), no router advertisements or autoconf (no
/// address or route appears by itself), and forwarding on a router.
pub fn enable_ipv6(ns: &str, router: bool) -> Result<()> {
    let mut settings = Vec::new();
    for conf in ["all", "default"] {
        // MLD's unsolicited reports all at once when a link comes up (1 ms apart, not up to 1 s),
        // so none crosses a link a scenario counts frames on later.
        for (key, value) in [
            ("accept_dad", 0),
            ("accept_ra", 0),
            ("autoconf", 0),
            ("mldv2_unsolicited_report_interval", 1),
            ("mldv1_unsolicited_report_interval", 1),
        ] {
            settings.push(format!("net.ipv6.conf.{conf}.{key}={value}"));
        }
    }
    settings.push(format!("net.ipv6.conf.all.forwarding={}", u8::from(router)));
    for conf in ["all", "default", "lo"] {
        settings.push(format!("net.ipv6.conf.{conf}.disable_ipv6=0"));
    }
    let mut args = vec!["-qw"];
    args.extend(settings.iter().map(String::as_str));
    exec(ns, "sysctl", &args)?;
    Ok(())
}

/// VPN client `index` (from 1): a namespace on the underlay that is only a mesh member.
fn add_vpn_client(lab: &mut Lab, topo: &mut Topology, index: u8, name: &str) -> Result<()> {
    let ns = format!("kl-vpn-{name}");
    lab.add_namespace(&ns)?;
    let underlay_ip = Ipv4Addr::new(192, 0, 2, 100 + index);
    attach_underlay(&ns, &format!("v{index}"), underlay_ip)?;
    // On a dual-stack mesh the client has a mesh IPv6 address too (and nothing else in IPv6);
    // otherwise IPv6 stays off.
    let mesh6 = match topo.scenario.mesh.ipv6 {
        true => {
            enable_ipv6(&ns, false)?;
            Some(vpn_mesh_address6(index)?)
        }
        false => None,
    };
    let wg_pid = start_wireguard(lab, &ns, name)?;
    let (key, public_key) = keypair(&topo.key_dir, &format!("vpn-{name}"))?;
    topo.mesh.push(MeshMember {
        name: format!("vpn:{name}"),
        ns,
        underlay: underlay_ip,
        mesh: Ipv4Addr::new(100, 64, 1, index),
        mesh6,
        pod_cidr: None,
        pod_cidr6: None,
        wg_pid,
        key,
        public_key,
        is_node: false,
    });

    Ok(())
}

fn underlay(lab: &mut Lab) -> Result<()> {
    lab.add_namespace(UL_NS)?;
    exec(UL_NS, "sysctl", &["-qw", "net.ipv4.ip_forward=0"])?;
    enable_ipv6(UL_NS, false)?;
    ip_in(UL_NS, "link add br0 type bridge")?;
    ip_in(UL_NS, "addr add 192.0.2.254/24 dev br0")?;
    ip_in(UL_NS, &format!("addr add {UNDERLAY_GW6}/64 dev br0 nodad"))?;
    ip_in(UL_NS, "link set br0 up")?;
    Ok(())
}

fn internet(lab: &mut Lab) -> Result<()> {
    lab.add_namespace(INET_NS)?;
    exec(INET_NS, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    enable_ipv6(INET_NS, true)?;
    for (br, addr, addr6) in [
        ("cli0", "198.51.100.1/24", "2001:db8:198::1/64"),
        ("pub0", "203.0.113.254/24", "2001:db8:203::fe/64"),
    ] {
        ip_in(INET_NS, &format!("link add {br} type bridge"))?;
        ip_in(INET_NS, &format!("addr add {addr} dev {br}"))?;
        ip_in(INET_NS, &format!("addr add {addr6} dev {br} nodad"))?;
        ip_in(INET_NS, &format!("link set {br} up"))?;
    }
    lab.add_namespace(CLIENT_NS)?;
    exec(CLIENT_NS, "sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"])?;
    enable_ipv6(CLIENT_NS, false)?;
    ip_line(&format!(
        "link add c0 netns {CLIENT_NS} type veth peer name ci0 netns {INET_NS}"
    ))?;
    ip_in(INET_NS, "link set ci0 master cli0 up")?;
    ip_in(CLIENT_NS, &format!("addr add {CLIENT_IP}/24 dev c0"))?;
    ip_in(CLIENT_NS, "link set c0 up")?;
    ip_in(CLIENT_NS, "route add default via 198.51.100.1")?;
    ip_in(CLIENT_NS, &format!("addr add {CLIENT_IP6}/64 dev c0 nodad"))?;
    ip_in(CLIENT_NS, "-6 route add default via 2001:db8:198::1 dev c0")?;
    Ok(())
}

fn attach_underlay(ns: &str, bridge_port: &str, addr: Ipv4Addr) -> Result<()> {
    ip_line(&format!(
        "link add ul0 netns {ns} type veth peer name {bridge_port} netns {UL_NS}"
    ))?;
    ip_in(UL_NS, &format!("link set {bridge_port} master br0 up"))?;
    ip_in(ns, &format!("addr add {addr}/24 dev ul0"))?;
    ip_in(ns, "link set ul0 up")?;
    Ok(())
}

/// Starts `wireguard-go wt0` with a private `/run/wireguard` (its own mount namespace: `ip
/// netns exec` unshares one), so every node has its own control socket.
pub fn start_wireguard(lab: &mut Lab, ns: &str, name: &str) -> Result<i32> {
    let pid = lab.spawn_as(
        ns,
        &format!("wireguard-{name}"),
        "wireguard-go",
        "sh",
        &[
            "-c",
            "mount -t tmpfs kl-run /run/wireguard && exec wireguard-go -f wt0",
        ],
    )?;
    let sock = format!("/proc/{pid}/root/run/wireguard/wt0.sock");
    if !sys::wait_until(Duration::from_secs(10), || Path::new(&sock).exists()) {
        let log =
            std::fs::read_to_string(lab.log_path(&format!("wireguard-{name}"))).unwrap_or_default();
        bail!("wireguard-go on {name} did not open its socket within 10 s: {log}");
    }
    Ok(pid)
}

fn keypair(dir: &Path, name: &str) -> Result<(PathBuf, String)> {
    let private = sys::run("wg", &["genkey"])?;
    let path = dir.join(format!("{name}.key"));
    // A WireGuard private key: for root only, like `wg genkey`'s documentation asks (`umask
    // 077`); the default mode let every local user read every lab node's key.
    sys::write_private(&path, private.as_bytes())?;
    let public = sys::run_with_input("wg", &["pubkey"], &private)?;
    Ok((path, public.trim().to_string()))
}

/// `wg` inside the mount and network namespaces of a member's wireguard-go.
pub fn wg(pid: i32, args: &[&str]) -> Result<String> {
    let pid = pid.to_string();
    let mut all = vec!["-t", pid.as_str(), "-m", "-n", "wg"];
    all.extend_from_slice(args);
    sys::run("nsenter", &all)
}

/// Keys, peers (each allowed only its own /32, plus its pod CIDR under native routing), the
/// address and netbird's policy routing.
pub fn configure_mesh(topo: &Topology, me: &MeshMember) -> Result<()> {
    let key = me.key.display().to_string();
    let mut args: Vec<String> = vec![
        "set".into(),
        "wt0".into(),
        "listen-port".into(),
        "51820".into(),
        "private-key".into(),
        key,
    ];
    if me.is_node {
        args.extend(["fwmark".into(), MESH_FWMARK.into()]);
    }
    for peer in topo.mesh.iter().filter(|p| p.name != me.name) {
        let mut allowed = format!("{}/32", peer.mesh);
        if let (Some(_), Some(peer6)) = (me.mesh6, peer.mesh6) {
            allowed.push_str(&format!(",{peer6}/128"));
        }
        if me.is_node {
            for cidr in peer.pod_cidr.iter().chain(&peer.pod_cidr6) {
                allowed.push(',');
                allowed.push_str(cidr);
            }
        }
        args.extend([
            "peer".into(),
            peer.public_key.clone(),
            "allowed-ips".into(),
            allowed,
            "endpoint".into(),
            format!("{}:51820", peer.underlay),
            "persistent-keepalive".into(),
            "25".into(),
        ]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    wg(me.wg_pid, &refs)?;
    ip_in(&me.ns, &format!("link set wt0 mtu {MESH_MTU} up"))?;
    ip_in(&me.ns, &format!("addr add {}/16 dev wt0", me.mesh))?;
    if let Some(mesh6) = me.mesh6 {
        ip_in(&me.ns, &format!("addr add {mesh6}/64 dev wt0 nodad"))?;
    }
    if !me.is_node {
        return Ok(());
    }
    mesh_routes(topo, me)?;
    // netbird installs its two rules in both families (the IPv6 mesh table holds only an exit
    // node's default route here: the mesh itself is IPv4).
    for family in ["", "-6 "] {
        let rules = ip_in(&me.ns, &format!("{family}rule show"))?;
        if !rules.contains("105:") {
            ip_in(
                &me.ns,
                &format!("{family}rule add pref 105 lookup main suppress_prefixlength 0"),
            )?;
            ip_in(
                &me.ns,
                &format!("{family}rule add pref 110 not fwmark {MESH_FWMARK} lookup {MESH_TABLE}"),
            )?;
        }
    }
    Ok(())
}

/// Routes through wt0 (they vanish with the device): the mesh table and, under native routing,
/// the other nodes' pod CIDRs.
fn mesh_routes(topo: &Topology, me: &MeshMember) -> Result<()> {
    let dest = if topo.scenario.mesh.exit_node {
        "default"
    } else {
        MESH_PREFIX
    };
    ip_in(
        &me.ns,
        &format!("route replace {dest} dev wt0 table {MESH_TABLE}"),
    )?;
    if me.mesh6.is_some() && !topo.scenario.mesh.exit_node {
        ip_in(
            &me.ns,
            &format!("-6 route replace {MESH_PREFIX6} dev wt0 table {MESH_TABLE}"),
        )?;
    }
    if topo.scenario.mesh.exit_node {
        // An exit node takes the IPv6 default as well: a reply kuport does not route leaves
        // into wt0, whose peers allow no such destination, and is lost.
        ip_in(
            &me.ns,
            &format!("-6 route replace default dev wt0 table {MESH_TABLE}"),
        )?;
    }
    for peer in topo.mesh.iter().filter(|p| p.name != me.name && p.is_node) {
        if let Some(cidr) = &peer.pod_cidr {
            ip_in(
                &me.ns,
                &format!("route replace {cidr} via {} dev wt0", peer.mesh),
            )?;
        }
        // wt0 is a layer-3 device: the IPv6 pod prefix needs no next hop, WireGuard picks the
        // peer by its allowed IPs.
        if let Some(cidr6) = &peer.pod_cidr6 {
            ip_in(&me.ns, &format!("-6 route replace {cidr6} dev wt0"))?;
        }
    }
    Ok(())
}

/// The CNI emulation of one node: the pod network device, cross-node pod routes and the
/// masquerade rules shaped like the real CNI's.
fn cni(topo: &Topology, node: &NodeInfo) -> Result<()> {
    let ns = &node.ns;
    let cni = topo.scenario.cni;
    if cni.is_cilium() {
        // A fixed address, as Cilium's cilium_host has: a bridge left to take its lowest
        // port's address changes it whenever a pod with a lower one joins, and every other
        // pod's cached neighbour entry for the gateway then points at a MAC nobody answers to
        // (their replies lost until the entry is re-probed, seconds later).
        ip_in(
            ns,
            &format!(
                "link add cilium_host address {} type bridge",
                pod_gateway_mac(node.index)
            ),
        )?;
        ip_in(
            ns,
            &format!("addr add {}/24 dev cilium_host", node.pod_gateway),
        )?;
        ip_in(
            ns,
            &format!("addr add {}/64 dev cilium_host nodad", node.pod_gateway6),
        )?;
        ip_in(ns, "link set cilium_host up")?;
    }
    if cni == Cni::CiliumTunnel {
        cilium_vxlan(topo, node)?;
    }
    let rules = match cni {
        Cni::CiliumTunnel | Cni::CiliumNative => format!(
            "{}oifname \"cilium_host\" ip saddr != {cidr} counter masquerade\n\
             ip saddr 10.244.0.0/16 oifname != \"cilium_*\" ip daddr != 10.244.0.0/16 counter masquerade",
            native_node_exception(topo, node, IpFamily::IPv4),
            cidr = node.pod_cidr
        ),
        Cni::Kindnet => "ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 counter masquerade\n\
             oifname != \"lo\" ip daddr 169.254.0.0/16 counter masquerade"
            .to_string(),
    };
    let table = format!(
        "table ip cni {{\n chain post {{\n  type nat hook postrouting priority srcnat; policy accept;\n{rules}\n }}\n}}\n{}",
        cni_table6(topo, cni, node)
    );
    sys::run_with_input("ip", &["netns", "exec", ns, "nft", "-f", "-"], &table)?;
    mark_keyed_neighbours(topo, node)
}

/// Cilium's overlay on one node: `cilium_vxlan` over the mesh (UDP 8472 between mesh
/// addresses, a fixed MAC), flooding to every peer, and each peer's pod CIDR and IPv6 pod prefix
/// routed through it to the peer's gateway.
fn cilium_vxlan(topo: &Topology, node: &NodeInfo) -> Result<()> {
    let ns = &node.ns;
    ip_in(
        ns,
        &format!(
            "link add cilium_vxlan address {} type vxlan id 2 dstport 8472 local {} dev wt0",
            vxlan_mac(node.index),
            node.mesh
        ),
    )?;
    ip_in(ns, "link set cilium_vxlan mtu 1370 up")?;
    for peer in topo.nodes.iter().filter(|p| p.name != node.name) {
        sys::run(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "bridge",
                "fdb",
                "append",
                "00:00:00:00:00:00",
                "dev",
                "cilium_vxlan",
                "dst",
                &peer.mesh.to_string(),
            ],
        )?;
        ip_in(
            ns,
            &format!(
                "route add {} via {} dev cilium_vxlan onlink",
                peer.pod_cidr, peer.pod_gateway
            ),
        )?;
        // The IPv6 pod prefix through the same tunnel to the peer's IPv6 gateway, whose
        // neighbour entry is written (neighbour discovery over the overlay would not answer
        // for an address of the peer's cilium_host, as ARP does), from this node's own.
        ip_in(
            ns,
            &format!(
                "-6 neigh replace {} lladdr {} dev cilium_vxlan nud permanent",
                peer.pod_gateway6,
                vxlan_mac(peer.index)
            ),
        )?;
        ip_in(
            ns,
            &format!(
                "-6 route add {} via {} dev cilium_vxlan onlink src {}",
                peer.pod_cidr6, peer.pod_gateway6, node.pod_gateway6
            ),
        )?;
    }
    Ok(())
}

/// Under native routing, the rule ahead of the masquerade that leaves this node's pods' traffic
/// to any Node's InternalIP of `family` as it is, with the pod's own address (one line, or
/// nothing in tunnel mode or with no such address): real Cilium accepts it first in
/// `CILIUM_POST_nat` (`-s <node range> -m set --match-set cilium_node_set_v4 dst -j ACCEPT`, an
/// ipset of every node's InternalIP), so a pod dialing a node's address is never masqueraded.
fn native_node_exception(topo: &Topology, node: &NodeInfo, family: IpFamily) -> String {
    if topo.scenario.cni != Cni::CiliumNative {
        return String::new();
    }
    let mut addresses: Vec<String> = topo
        .nodes
        .iter()
        .filter_map(|n| {
            let (v4, v6) = topo.internal_ips(n);
            match family {
                IpFamily::IPv4 => v4.map(|a| a.to_string()),
                IpFamily::IPv6 => v6.map(|a| a.to_string()),
            }
        })
        .collect();
    addresses.sort();
    if addresses.is_empty() {
        return String::new();
    }
    let (ip, cidr) = match family {
        IpFamily::IPv4 => ("ip", &node.pod_cidr),
        IpFamily::IPv6 => ("ip6", &node.pod_cidr6),
    };
    format!(
        "{ip} saddr {cidr} {ip} daddr {{ {} }} counter accept\n",
        addresses.join(", ")
    )
}

/// Node `index`'s `cilium_vxlan` MAC address, fixed so its peers can write their IPv6 neighbour
/// entry for its gateway.
/// The fixed MAC of node `index`'s pod gateway (`cilium_host`).
fn pod_gateway_mac(index: u8) -> String {
    format!("02:c1:00:00:01:{index:02x}")
}

fn vxlan_mac(index: u8) -> String {
    format!("02:c1:00:00:00:{index:02x}")
}

/// The CNI's IPv6 masquerade, shaped as its IPv4 one (Cilium masquerades IPv6 too; kindnet's
/// IPv6 masquerade covers pod traffic to non-pod destinations; link-local IPv6 destinations are
/// never routed, so its 169.254.0.0/16 rule has no twin).
fn cni_table6(topo: &Topology, cni: Cni, node: &NodeInfo) -> String {
    let rules = match cni {
        Cni::CiliumTunnel | Cni::CiliumNative => format!(
            "{}oifname \"cilium_host\" ip6 saddr != {cidr} counter masquerade\n\
             ip6 saddr {POD_SUPERNET6} oifname != \"cilium_*\" ip6 daddr != {POD_SUPERNET6} counter masquerade",
            native_node_exception(topo, node, IpFamily::IPv6),
            cidr = node.pod_cidr6
        ),
        Cni::Kindnet => {
            format!("ip6 saddr {POD_SUPERNET6} ip6 daddr != {POD_SUPERNET6} counter masquerade")
        }
    };
    format!(
        "table ip6 cni {{\n chain post {{\n  type nat hook postrouting priority srcnat; policy accept;\n{rules}\n }}\n}}\n"
    )
}

/// The mark-keyed rules of datapaths that share the mark word with kuport, so a collision with
/// their bits fails a scenario: kube-proxy's masquerade of 0x4000 and drop of 0x8000 (on
/// forwarded packets, the path kuport's marked packets take), and Cilium's policy rules at pref 9
/// and 10 on its 0x0F00 magic marks (into tables that swallow the packet here). kube-proxy's
/// rules are left out beside netbird: netbird's own mark, 0x1bd00, carries the 0x8000 bit, so
/// the two collide with each other whatever kuport does.
fn mark_keyed_neighbours(topo: &Topology, node: &NodeInfo) -> Result<()> {
    let ns = &node.ns;
    if topo.scenario.mesh.netbird {
        return cilium_mark_rules(topo, ns);
    }
    // kube-proxy on a dual-stack cluster installs the same rules in both families.
    for family in ["ip", "ip6"] {
        let kube_proxy = format!(
            "table {family} lab-kube-proxy {{\n\
             \tchain post {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tmeta mark & 0x00004000 == 0x00004000 counter masquerade\n\
             \t}}\n\
             \tchain forward {{\n\
             \t\ttype filter hook forward priority filter; policy accept;\n\
             \t\tmeta mark & 0x00008000 == 0x00008000 counter drop\n\
             \t}}\n\
             }}\n"
        );
        sys::run_with_input("ip", &["netns", "exec", ns, "nft", "-f", "-"], &kube_proxy)?;
    }
    cilium_mark_rules(topo, ns)
}

/// Cilium's rules in both families (it installs them for each family it serves).
fn cilium_mark_rules(topo: &Topology, ns: &str) -> Result<()> {
    if topo.scenario.cni.is_cilium() {
        for family in ["", "-6 "] {
            ip_in(
                ns,
                &format!("{family}rule add pref 9 fwmark 0x200/0xf00 lookup 2004"),
            )?;
            ip_in(
                ns,
                &format!("{family}rule add pref 10 fwmark 0xa00/0xf00 lookup 2005"),
            )?;
            ip_in(
                ns,
                &format!("{family}route add blackhole default table 2004"),
            )?;
            ip_in(
                ns,
                &format!("{family}route add blackhole default table 2005"),
            )?;
        }
    }
    Ok(())
}

/// The host firewall and mesh filter variants of a node, as nftables tables of their own.
fn host_filters(topo: &Topology, node: &NodeInfo) -> Result<()> {
    let mut tables = String::new();
    if topo.scenario.mesh.netbird {
        tables.push_str(&netbird_table());
    }
    if let Some(Firewall::Talos) = topo.scenario.host.firewall {
        tables.push_str(&talos_table(&topo.scenario.host.open)?);
    }
    if topo.scenario.host.rp_filter == RpFilter::Strict {
        tables.push_str(RPFILTER6_TABLE);
    }
    if tables.is_empty() {
        return Ok(());
    }
    sys::run_with_input(
        "ip",
        &["netns", "exec", &node.ns, "nft", "-f", "-"],
        &tables,
    )?;
    Ok(())
}

/// IPv6 has no `rp_filter` sysctl: a strict reverse-path check is an nftables `fib` rule, shaped
/// as firewalld's `IPv6_rpfilter` (its default): after the mangle hooks, so the packet's mark
/// counts in the lookup, drop a packet whose source is not routed back out of the interface it
/// came in on (neighbour discovery excepted). TCP and UDP drops are counted apart from the rest,
/// so a scenario can tell a mapped flow's drop from the multicast listener reports a pod sends
/// from its link-local address before the node's side of its network has one (dropped too, as
/// firewalld does, and never kuport's).
pub const RPFILTER6_TABLE: &str = "table inet lab-rpfilter6 {\n\
     \tchain pre {\n\
     \t\ttype filter hook prerouting priority filter + 10; policy accept;\n\
     \t\tmeta nfproto ipv6 icmpv6 type { nd-router-advert, nd-neighbor-solicit } accept\n\
     \t\tmeta nfproto ipv6 meta l4proto { tcp, udp } fib saddr . mark . iif oif missing counter drop\n\
     \t\tmeta nfproto ipv6 fib saddr . mark . iif oif missing counter drop\n\
     \t}\n\
     }\n";

/// netbird's shape: mark mesh traffic for the node itself at -150 (only while its destination
/// is still local), and drop forwarded mesh traffic whose mark is not exactly netbird's.
pub fn netbird_table() -> String {
    format!(
        "table ip lab-netbird {{\n\
         \tchain mangle-pre {{\n\
         \t\ttype filter hook prerouting priority -150; policy accept;\n\
         \t\tiifname \"wt0\" fib daddr type local counter meta mark set {MESH_FWMARK}\n\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname \"wt0\" ip daddr != 10.244.0.0/16 meta mark != {MESH_FWMARK} counter drop\n\
         \t}}\n\
         }}\n"
    )
}

/// Talos's ingress firewall in block mode: new connections to the node's own addresses are
/// dropped at -110 unless the port is open (the mesh port always is).
pub fn talos_table(open: &[String]) -> Result<String> {
    let mut accepts = String::from("\t\tudp dport 51820 accept\n");
    for port in open {
        let (proto, ports) = port
            .split_once('/')
            .filter(|(p, _)| *p == "udp" || *p == "tcp")
            .with_context(|| format!("host.open entry {port:?}: expected udp/PORT or tcp/PORT"))?;
        accepts.push_str(&format!("\t\t{proto} dport {ports} accept\n"));
    }
    Ok(format!(
        "table inet lab-talos {{\n\
         \tchain ingress {{\n\
         \t\ttype filter hook prerouting priority -110; policy accept;\n\
         \t\tiifname \"lo\" accept\n\
         \t\tct state != new accept\n\
         \t\tfib daddr type != local accept\n\
         \t\tmeta l4proto {{ icmp, ipv6-icmp }} accept\n\
         {accepts}\
         \t\tcounter name \"dropped\" drop\n\
         \t}}\n\
         \tcounter dropped {{\n\
         \t}}\n\
         }}\n"
    ))
}

/// Every node reaches every other member over the mesh before anything else runs.
fn check_mesh(topo: &Topology) -> Result<()> {
    for a in topo.mesh.iter().filter(|m| m.is_node) {
        for b in topo.mesh.iter().filter(|m| m.name != a.name) {
            let mut targets = vec![IpAddr::V4(b.mesh)];
            targets.extend(a.mesh6.and(b.mesh6).map(IpAddr::V6));
            for target in targets {
                let ok = sys::wait_until(Duration::from_secs(10), || {
                    exec(&a.ns, "ping", &["-c1", "-W1", &target.to_string()]).is_ok()
                });
                if !ok {
                    bail!(
                        "mesh: {} cannot reach {} ({target}) over wt0",
                        a.name,
                        b.name
                    );
                }
            }
        }
    }
    Ok(())
}

/// IPv6 reaches every element before anything else runs: the internet client each public
/// node's `enp1s0` (unless the mesh is an exit node), and every pod from its own node. (Across nodes is the scenario's business:
/// a host firewall may close the CNI's overlay on purpose; `lab/tests/cli.rs` proves it for
/// every CNI emulation.)
pub fn check_ipv6(topo: &Topology) -> Result<()> {
    // (namespace, who pings, what it pings, the address)
    let mut checks: Vec<(&str, String, String, Ipv6Addr)> = Vec::new();
    // Behind an exit node the node's own answers route into the mesh: only what kuport maps
    // is reachable from the internet, which is the scenario's to prove.
    let nodes = match topo.scenario.mesh.exit_node {
        true => &[][..],
        false => &topo.nodes[..],
    };
    for n in nodes {
        if let Some(public6) = n.public6 {
            let what = format!("{}'s enp1s0", n.name);
            checks.push((CLIENT_NS, "the internet client".into(), what, public6));
        }
    }
    for (key, pod) in &topo.pods {
        let from = topo.node(&pod.node)?;
        let who = format!("node {}", from.name);
        checks.push((&from.ns, who, format!("pod {key}"), pod.ip6));
    }
    for (ns, who, what, addr) in checks {
        let target = addr.to_string();
        let ok = sys::wait_until(Duration::from_secs(5), || {
            exec(ns, "ping", &["-6", "-c1", "-W1", &target]).is_ok()
        });
        if !ok {
            bail!("IPv6: {who} cannot reach {what} at {target}");
        }
    }
    Ok(())
}

/// Restarts a member's wireguard-go: the kernel deletes wt0 and every link bound to it.
pub fn restart_mesh(lab: &mut Lab, topo: &mut Topology, name: &str) -> Result<()> {
    let idx = topo
        .mesh
        .iter()
        .position(|m| m.name == name)
        .with_context(|| format!("no mesh member {name}"))?;
    let old = topo.mesh[idx].wg_pid;
    lab.stop(old, rustix::process::Signal::TERM, Duration::from_secs(3))?;
    let ns = topo.mesh[idx].ns.clone();
    sys::wait_until(Duration::from_secs(3), || {
        ip_in(&ns, "link show wt0").is_err()
    });
    let pid = start_wireguard(lab, &ns, name)?;
    topo.mesh[idx].wg_pid = pid;
    let me = topo.mesh[idx].clone();
    configure_mesh(topo, &me)?;
    // The restarted daemon has no sessions; its peers keep sending with the old keys until
    // they re-handshake (up to ~15 s). A ping from the restarted side starts the handshake at
    // once, as a netbird restart does when it reconnects to its peers.
    for peer in topo.mesh.iter().filter(|p| p.name != me.name) {
        let target = peer.mesh.to_string();
        if !sys::wait_until(Duration::from_secs(10), || {
            exec(&me.ns, "ping", &["-c1", "-W1", &target]).is_ok()
        }) {
            bail!(
                "mesh: {} cannot reach {} after its restart",
                me.name,
                peer.name
            );
        }
    }
    Ok(())
}

/// Creates a pod namespace on its node and starts its responders.
pub fn start_pod(lab: &mut Lab, topo: &mut Topology, spec: &PodSpec, node: &str) -> Result<()> {
    let n = topo.node(node)?.clone();
    topo.next_pod += 1;
    let k = topo.next_pod;
    let host_octet = u8::try_from(9 + k).context("too many pods in one scenario")?;
    let pod_ip = Ipv4Addr::new(10, 244, n.index, host_octet);
    let pod_ip6 = pod_address6(n.index, host_octet)?;
    let ns = format!("kl-pod-{k}");
    lab.add_namespace(&ns)?;
    enable_ipv6(&ns, false)?;
    let host_if = if topo.scenario.cni.is_cilium() {
        format!("lxc{k}")
    } else {
        format!("veth{k}")
    };
    ip_line(&format!(
        "link add eth0 netns {ns} type veth peer name {host_if} netns {}",
        n.ns
    ))?;
    ip_in(&ns, &format!("addr add {pod_ip}/24 dev eth0"))?;
    ip_in(&ns, "link set eth0 up")?;
    pod_network(topo, &n, &ns, &host_if, pod_ip, pod_ip6)?;
    let mut pod = PodInfo {
        spec: spec.clone(),
        ns,
        ip: pod_ip,
        ip6: pod_ip6,
        node: node.to_string(),
        ready: true,
        responders: BTreeMap::new(),
    };
    for port in spec.ports.clone() {
        start_responder(lab, topo, &mut pod, port.protocol, port.port)?;
    }
    topo.pods.insert(spec.key(), pod);
    Ok(())
}

/// A pod's side of the CNI emulation, both families: under Cilium a port of `cilium_host`
/// (hairpin on) and default routes via the node's gateway addresses; under kindnet a
/// point-to-point veth with the gateway addresses on the host side and host routes to the pod.
fn pod_network(
    topo: &Topology,
    n: &NodeInfo,
    ns: &str,
    host_if: &str,
    pod_ip: Ipv4Addr,
    pod_ip6: Ipv6Addr,
) -> Result<()> {
    if topo.scenario.cni.is_cilium() {
        ip_in(ns, &format!("addr add {pod_ip6}/64 dev eth0 nodad"))?;
        ip_in(&n.ns, &format!("link set {host_if} master cilium_host up"))?;
        // Hairpin mode, as kubelet (`--hairpin-mode`) and the bridge CNI plugin set it on a
        // pod's bridge port: with `br_netfilter` loaded, a pod's frame DNATed back to that
        // same pod (a pod dialing its own published address) would otherwise be dropped by
        // the bridge for leaving by the port it came in on.
        ip_in(
            &n.ns,
            &format!("link set {host_if} type bridge_slave hairpin on"),
        )?;
        ip_in(ns, &format!("route add default via {}", n.pod_gateway))?;
        ip_in(ns, &format!("-6 route add default via {}", n.pod_gateway6))?;
    } else {
        // kindnet: a point-to-point veth per pod, the gateway address on every host side
        // (IPv6: the pod's own /128, everything else via the gateway).
        ip_in(ns, &format!("addr add {pod_ip6}/128 dev eth0 nodad"))?;
        ip_in(
            &n.ns,
            &format!("addr add {}/32 dev {host_if}", n.pod_gateway),
        )?;
        ip_in(&n.ns, &format!("link set {host_if} up"))?;
        ip_in(&n.ns, &format!("route add {pod_ip}/32 dev {host_if}"))?;
        ip_in(
            ns,
            &format!("route add default via {} dev eth0 onlink", n.pod_gateway),
        )?;
        ip_in(
            &n.ns,
            &format!("addr add {}/128 dev {host_if} nodad", n.pod_gateway6),
        )?;
        ip_in(&n.ns, &format!("-6 route add {pod_ip6}/128 dev {host_if}"))?;
        ip_in(
            ns,
            &format!(
                "-6 route add default via {} dev eth0 onlink",
                n.pod_gateway6
            ),
        )?;
    }
    Ok(())
}

/// Starts the echo responder for one port (or the range the pod spec gives it).
pub fn start_responder(
    lab: &mut Lab,
    topo: &Topology,
    pod: &mut PodInfo,
    protocol: Protocol,
    port: u16,
) -> Result<()> {
    let end = pod
        .spec
        .ports
        .iter()
        .find(|p| p.protocol == protocol && p.port == port)
        .and_then(|p| p.end_port)
        .unwrap_or(port);
    let range = if end > port {
        format!("{port}-{end}")
    } else {
        port.to_string()
    };
    let what = format!("echo-{}-{}-{}", pod.spec.key(), protocol.lower(), port);
    let pid = spawn_echo(lab, topo, &pod.ns, &what, protocol, &range, &pod.spec.key())?;
    pod.responders.insert((protocol, port), pid);
    Ok(())
}

/// Starts `kuport-echo serve` on `ports` (every address of namespace `ns`), tagging its answers
/// with `tag`, and waits until it listens. The lab records the pid and stops it with the rest.
pub fn spawn_echo(
    lab: &mut Lab,
    topo: &Topology,
    ns: &str,
    what: &str,
    protocol: Protocol,
    ports: &str,
    tag: &str,
) -> Result<i32> {
    spawn_echo_args(
        lab,
        topo,
        ns,
        what,
        &["serve", protocol.lower(), ports, "--tag", tag],
    )
}

/// A host listener: an echo server tagged with its own name, on `address` alone when given.
pub fn spawn_echo_on(
    lab: &mut Lab,
    topo: &Topology,
    ns: &str,
    what: &str,
    protocol: Protocol,
    ports: &str,
    address: Option<&str>,
) -> Result<i32> {
    let mut args = vec!["serve", protocol.lower(), ports, "--tag", what];
    if let Some(address) = address {
        args.extend(["--bind", address]);
    }
    spawn_echo_args(lab, topo, ns, what, &args)
}

fn spawn_echo_args(
    lab: &mut Lab,
    topo: &Topology,
    ns: &str,
    what: &str,
    args: &[&str],
) -> Result<i32> {
    let pid = lab.spawn(ns, what, &topo.bin("kuport-echo"), args)?;
    let log = lab.log_path(what);
    if !sys::wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("ready"))
    }) {
        bail!(
            "echo server {what} did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    Ok(pid)
}

/// Removes a pod: its responders and its namespace (the host-side veth goes with it).
pub fn remove_pod(lab: &mut Lab, topo: &mut Topology, key: &str) -> Result<PodInfo> {
    let pod = topo
        .pods
        .remove(key)
        .with_context(|| format!("no pod {key}"))?;
    for pid in pod.responders.values() {
        lab.stop(*pid, rustix::process::Signal::TERM, Duration::from_secs(2))?;
    }
    ip(&["netns", "del", &pod.ns])?;
    lab.state.namespaces.retain(|n| n != &pod.ns);
    Ok(pod)
}

/// A node's listing of everything that is not kuport's, normalised so counters and kuport's own
/// objects do not show: nft ruleset, ip rules, routes, links, addresses and rp_filter settings.
pub fn foreign_listing(ns: &str) -> Result<String> {
    let mut out = String::new();
    let ruleset = exec(ns, "nft", &["list", "ruleset"])?;
    out.push_str("# nft\n");
    let mut skipping = false;
    for line in ruleset.lines() {
        if line.starts_with("table ip kuport") {
            skipping = true;
            continue;
        }
        if skipping {
            if line == "}" {
                skipping = false;
            }
            continue;
        }
        out.push_str(&strip_counters(line));
        out.push('\n');
    }
    out.push_str("# rules\n");
    for line in ip_in(ns, "rule show")?.lines() {
        if !is_kuport_rule(line) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# routes\n");
    let kuport_tables: Vec<String> = ip_in(ns, "rule show")?
        .lines()
        .filter(|l| is_kuport_rule(l))
        .filter_map(|l| l.split("lookup ").nth(1).map(|t| t.trim().to_string()))
        .filter(|t| t != "main")
        .collect();
    for line in ip_in(ns, "route show table all")?.lines() {
        let in_kuport_table = kuport_tables.iter().any(|t| {
            line.contains(&format!("table {t} ")) || line.ends_with(&format!("table {t}"))
        });
        if !line.contains(LINK_PREFIX) && !in_kuport_table {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# links\n");
    for line in ip_in(ns, "-o link show")?.lines() {
        if !line.contains(&format!(": {LINK_PREFIX}")) {
            // Counters and the kernel's link index of a peer are not configuration.
            out.push_str(
                &line
                    .split("\\    link/")
                    .next()
                    .unwrap_or(line)
                    .replace("state UNKNOWN", ""),
            );
            out.push('\n');
        }
    }
    out.push_str("# addresses\n");
    for line in ip_in(ns, "-o addr show")?.lines() {
        if !line.contains(&format!(" {LINK_PREFIX}")) {
            out.push_str(line.split("valid_lft").next().unwrap_or(line));
            out.push('\n');
        }
    }
    out.push_str("# sysctl\n");
    let sysctls = sh(
        ns,
        "for f in /proc/sys/net/ipv4/conf/*/rp_filter /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/fwmark_reflect; do echo \"$f $(cat $f)\"; done",
    )?;
    for line in sysctls.lines() {
        if !line.contains(&format!("/{LINK_PREFIX}")) {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// kuport's ip rules sit at priorities 101 and 102 (nothing else of the lab's uses them).
fn is_kuport_rule(line: &str) -> bool {
    [PREF_LOOP_GUARD, PREF_REPLY]
        .iter()
        .any(|pref| line.starts_with(&format!("{pref}:")))
}

fn strip_counters(line: &str) -> String {
    let mut words: Vec<&str> = Vec::new();
    let mut iter = line.split(' ').peekable();
    while let Some(w) = iter.next() {
        if w == "packets" || w == "bytes" {
            iter.next();
            continue;
        }
        words.push(w);
    }
    words.join(" ")
}

/// Whether a node holds nothing of kuport's: no table, no `kup-` link, no kuport rule or route.
pub fn kuport_leftovers(ns: &str) -> Result<Vec<String>> {
    let mut left = Vec::new();
    if exec(ns, "nft", &["list", "table", "ip", TABLE]).is_ok() {
        left.push(format!("table ip {TABLE}"));
    }
    for line in ip_in(ns, "-o link show")?.lines() {
        if let Some(name) = line.split(": ").nth(1)
            && name.starts_with(LINK_PREFIX)
        {
            left.push(format!("link {}", name.split('@').next().unwrap_or(name)));
        }
    }
    for line in ip_in(ns, "rule show")?.lines() {
        if is_kuport_rule(line) {
            left.push(format!("rule {line}"));
        }
    }
    for line in ip_in(ns, "route show table all")?.lines() {
        if line.contains(LINK_PREFIX) {
            left.push(format!("route {line}"));
        }
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A topology of nodes a and b under `cni`, built without a network (only what the rules
    /// read).
    fn two_nodes(cni: &str, mesh6: bool) -> Topology {
        let yaml = format!(
            "name: t\ncni: {cni}\nmesh: {{ipv6: {mesh6}}}\nnodes: [{{name: a, public: true}}, {{name: b}}]\nsteps: []\n"
        );
        let scenario: Scenario = serde_saphyr::from_str(&yaml).expect("a scenario");
        let nodes = (1..=2u8)
            .map(|i| NodeInfo {
                name: if i == 1 { "a" } else { "b" }.to_owned(),
                ns: format!("kl-{i}"),
                index: i,
                public: None,
                mesh: Ipv4Addr::new(100, 64, 0, i),
                mesh6: mesh6.then(|| Ipv6Addr::new(0xfd00, 0x100, 0x64, 0, 0, 0, 0, i.into())),
                pod_cidr: format!("10.244.{i}.0/24"),
                pod_gateway: Ipv4Addr::new(10, 244, i, 1),
                public6: None,
                pod_cidr6: format!("fd00:10:244:{i}::/64"),
                pod_gateway6: Ipv6Addr::new(0xfd00, 0x10, 0x244, i.into(), 0, 0, 0, 1),
            })
            .collect();
        Topology {
            scenario,
            nodes,
            mesh: Vec::new(),
            pods: BTreeMap::new(),
            bins: PathBuf::new(),
            kubeconfig: PathBuf::new(),
            api_pid: None,
            agents: BTreeMap::new(),
            next_pod: 0,
            key_dir: PathBuf::new(),
        }
    }

    #[test]
    fn native_routing_leaves_a_pods_traffic_to_node_addresses_unmasqueraded() {
        let topo = two_nodes("cilium-native", true);
        let b = &topo.nodes[1];
        assert_eq!(
            native_node_exception(&topo, b, IpFamily::IPv4),
            "ip saddr 10.244.2.0/24 ip daddr { 100.64.0.1, 100.64.0.2 } counter accept\n"
        );
        assert_eq!(
            native_node_exception(&topo, b, IpFamily::IPv6),
            "ip6 saddr fd00:10:244:2::/64 ip6 daddr { fd00:100:64::1, fd00:100:64::2 } counter accept\n"
        );
        // The exception comes before the masquerade it exempts from.
        let table = cni_table6(&topo, Cni::CiliumNative, b);
        let accept = table.find("counter accept").expect("the exception");
        assert!(
            accept < table.find("masquerade").expect("the masquerade"),
            "{table}"
        );
        // An IPv4-only mesh has no IPv6 InternalIP to exempt.
        let v4_only = two_nodes("cilium-native", false);
        assert_eq!(
            native_node_exception(&v4_only, &v4_only.nodes[0], IpFamily::IPv6),
            ""
        );
        // Tunnel mode masquerades it, as real Cilium does (to the node's mesh address).
        let tunnel = two_nodes("cilium-tunnel", true);
        assert_eq!(
            native_node_exception(&tunnel, &tunnel.nodes[1], IpFamily::IPv4),
            ""
        );
    }

    #[test]
    fn counters_do_not_make_a_foreign_listing_differ() {
        assert_eq!(
            strip_counters("\t\ttcp dport 9999 counter packets 12 bytes 720 accept"),
            "\t\ttcp dport 9999 counter accept"
        );
    }
}
