//! The cluster of the nft and flow measurements: one node, one class, N UDP PortMaps whose pods
//! all run on that node (so no return link is needed and every rule is a nat rule).
//!
//! The mapping the flow measurements send to ([`TARGET_PORT`] → [`TARGET_POD`]) sorts last in
//! both nat chains (highest port in `kup-pre`, highest address in `kup-post`): a new flow to it
//! is checked against every other mapping's rule first, the worst case a linear chain has.
//!
//! The IPv6 flow measurements plan the same cluster with every pod dual-stack (an IPv6 slice
//! beside each IPv4 one, the Node advertising an IPv6 pod CIDR) and the public interface
//! holding an IPv6 address too: the `ip6 kuport` table then holds the IPv6 twin of every
//! mapping, its target ([`TARGET_POD6`]) last as well.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::jiff::Timestamp;
use kuport_core::ir::{ChainId, Family, HostState, NftTable, Rule};
use kuport_core::plan::plan;
use kuport_core::snapshot::{HostFacts, Snapshot};
use kuport_testkit::cluster::{CREATED, NOW, facts_v4};
use kuport_testkit::objects::{self, endpoint, node_row, nodes_json, pm, slice, vxlan_return_path};
use serde_json::{Value, json};

/// The node every mapping lands on.
pub const NODE: &str = "node-0";
/// Its InternalIP.
pub const INTERNAL_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// Its public interface, the class's only interface.
pub const PUBLIC_IF: &str = "eth0";
/// The public interface's address: what clients dial.
pub const PUBLIC_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The port of the mapping the flow measurements use.
pub const TARGET_PORT: u16 = 29_999;
/// Its pod.
pub const TARGET_POD: Ipv4Addr = Ipv4Addr::new(10, 244, 200, 2);
/// The public interface's IPv6 address, in the dual-stack cluster.
pub const PUBLIC_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 1);
/// The target's pod in IPv6.
pub const TARGET_POD6: Ipv6Addr = pod6(TARGET_POD);
/// The Node's IPv6 pod CIDR in the dual-stack cluster: every [`pod6`] address lies in it.
const POD_NETWORK6: &str = "fd00:10:244::/64";
/// First port of the other mappings (one each, upwards).
const FIRST_PORT: u16 = 20_000;
const NAMESPACE: &str = "bench";
const CLASS: &str = "bench";

/// The instant every plan is computed at: the tests' (testkit's).
pub fn now() -> Result<Timestamp> {
    NOW.parse().context("parsing the bench's fixed timestamp")
}

/// What the node reads from its own host.
pub fn facts() -> HostFacts {
    facts_v4(&[(PUBLIC_IF, PUBLIC_ADDR)], PUBLIC_IF, 1500)
}

/// What the node of the cluster planned for `family` reads from its host: for IPv6, its public
/// interface's IPv6 address as well.
pub fn facts_in(family: Family) -> HostFacts {
    let mut facts = facts();
    if family == Family::V6 {
        facts.interfaces6.insert(PUBLIC_IF.to_owned(), PUBLIC_ADDR6);
    }
    facts
}

/// What clients dial in `family`.
pub fn public_addr(family: Family) -> IpAddr {
    match family {
        Family::V4 => PUBLIC_ADDR.into(),
        Family::V6 => PUBLIC_ADDR6.into(),
    }
}

/// The target mapping's pod address in `family`.
pub fn target_pod(family: Family) -> IpAddr {
    match family {
        Family::V4 => TARGET_POD.into(),
        Family::V6 => TARGET_POD6.into(),
    }
}

/// A pod's IPv6 address: its IPv4 address as the low 32 bits of `fd00:10:244::/64`, so the
/// IPv6 addresses sort as the IPv4 ones do.
pub const fn pod6(v4: Ipv4Addr) -> Ipv6Addr {
    let [a, b, c, d] = v4.octets();
    Ipv6Addr::new(
        0xfd00,
        0x10,
        0x244,
        0,
        0,
        0,
        u16::from_be_bytes([a, b]),
        u16::from_be_bytes([c, d]),
    )
}

/// Mapping `j` of `n`: (port, pod address). The last one is the target.
fn mapping(j: usize, n: usize) -> Result<(u16, Ipv4Addr)> {
    if j + 1 == n {
        return Ok((TARGET_PORT, TARGET_POD));
    }
    let port = u16::try_from(j)
        .ok()
        .and_then(|j| FIRST_PORT.checked_add(j))
        .filter(|p| *p < TARGET_PORT)
        .with_context(|| format!("mapping {j} does not fit below port {TARGET_PORT}"))?;
    // Pods in 10.244.1.0–10.244.199.255: all sort before the target's 10.244.200.2.
    let pod = Ipv4Addr::new(10, 244, 1 + (j / 250) as u8, 2 + (j % 250) as u8);
    Ok((port, pod))
}

/// The snapshot with `n` mappings (n ≥ 1), all on [`NODE`]. With `moved`, mapping 0's pod has
/// another address (one changed endpoint).
pub fn snapshot(n: usize, moved: bool) -> Result<Snapshot> {
    snapshot_in(n, moved, Family::V4)
}

/// [`snapshot`] for the flow measurements of `family`: with IPv6, every pod is dual-stack.
pub fn snapshot_in(n: usize, moved: bool, family: Family) -> Result<Snapshot> {
    if n == 0 || n > 9_999 {
        bail!("the bench cluster holds 1 to 9,999 mappings, not {n}");
    }
    let dual = family == Family::V6;
    let mut snap = Snapshot::default();
    let mut node = objects::node(NODE, Some(&INTERNAL_IP.to_string()), true);
    if dual {
        node["spec"]["podCIDRs"] = json!([objects::POD_NETWORK, POD_NETWORK6]);
    }
    snap.nodes
        .push(serde_json::from_value(node).context("building the Node")?);
    let namespace = objects::namespace(NAMESPACE, Value::Null);
    snap.namespaces
        .push(serde_json::from_value(namespace).context("building the Namespace")?);
    let spec = json!({
        "nodes": nodes_json(&[(NODE, &[PUBLIC_IF])]),
        // One namespace holds every benched mapping: no quota may refuse one.
        "ports": {"min": 1024, "max": 65535, "perNamespace": 131072},
        "returnPath": vxlan_return_path(7000, 4790, "169.254.0.0/20")});
    let mut row = node_row(NODE, json!({PUBLIC_IF: PUBLIC_ADDR.to_string()}), 1500);
    if dual {
        row["ipv6Addresses"] = json!({PUBLIC_IF: PUBLIC_ADDR6.to_string()});
    }
    let class = objects::class(CLASS, spec)
        .created(CREATED)
        .generation(1)
        .status(json!({"nodes": [row]}));
    snap.classes
        .push(serde_json::from_value(class.object()).context("building the PortMapClass")?);
    for j in 0..n {
        let (port, mut pod) = mapping(j, n)?;
        if moved && j == 0 {
            pod = Ipv4Addr::new(10, 244, 250, 9);
        }
        let name = format!("pm-{j:04}");
        let created = format!("2026-02-01T00:{:02}:{:02}Z", (j / 60) % 60, j % 60);
        let portmap = pm(NAMESPACE, &name, CLASS, port.into())
            .generation(1)
            .created(&created);
        snap.portmaps.push(
            serde_json::from_value(portmap.object())
                .with_context(|| format!("building PortMap {name}"))?,
        );
        push_slice(&mut snap, &name, port, pod.into())?;
        if dual {
            push_slice(&mut snap, &name, port, pod6(pod).into())?;
        }
    }
    Ok(snap)
}

/// Adds the EndpointSlice of mapping `name` in `address`'s family (`<name>-x` for IPv4,
/// `<name>-y` for IPv6) with its port and its one ready endpoint, pod `<name>-0` on [`NODE`].
fn push_slice(snap: &mut Snapshot, name: &str, port: u16, address: IpAddr) -> Result<()> {
    let mut s = slice(NAMESPACE, &format!("{name}-x"), name);
    if address.is_ipv6() {
        s = slice(NAMESPACE, &format!("{name}-y"), name).ipv6();
    }
    let endpoint = endpoint(&address.to_string(), NODE)
        .ready(true)
        .pod(NAMESPACE, &format!("{name}-0"));
    let object = s.port("game", "UDP", port).endpoint(endpoint).object();
    snap.endpoint_slices.push(
        serde_json::from_value(object)
            .with_context(|| format!("building the {address} EndpointSlice of {name}"))?,
    );
    Ok(())
}

/// The node's desired host state for `snap`, checked to hold one DNAT rule per mapping and,
/// with `target_last`, the target's rules last.
pub fn host_state(snap: &Snapshot, target_last: bool) -> Result<HostState> {
    host_state_in(snap, Family::V4, target_last)
}

/// [`host_state`] for a snapshot of [`snapshot_in`] with `family`, checked in the table of that
/// family (the node's facts of [`facts_in`]).
pub fn host_state_in(snap: &Snapshot, family: Family, target_last: bool) -> Result<HostState> {
    let p = plan(snap, NODE, &facts_in(family), now()?);
    let table = p.host_state.table(family);
    let dnat: Vec<_> = table.dnat_rules().collect();
    if dnat.len() != snap.portmaps.len() {
        bail!(
            "the plan emits {} {family} DNAT rules for {} mappings (first decision: {:?})",
            dnat.len(),
            snap.portmaps.len(),
            p.portmaps.first().map(|d| (&d.accepted, &d.programmed))
        );
    }
    let last_pre = dnat.last().map(|d| (d.ports.first, d.to));
    let last_post = table.rules(ChainId::Post).last().and_then(|r| match r {
        Rule::IdentitySnat(s) => Some((s.ports.first, s.daddr)),
        _ => None,
    });
    let want = Some((TARGET_PORT, target_pod(family)));
    if target_last && (last_pre != want || last_post != want) {
        bail!(
            "the target mapping is not last in both {family} nat chains (kup-pre ends with \
             {last_pre:?}, kup-post with {last_post:?})"
        );
    }
    Ok(p.host_state)
}

/// Number of rules in an IR table (one per mapping and chain).
fn ir_rules(table: &NftTable) -> usize {
    table.chains.iter().map(|(_, r)| r.len()).sum()
}

/// What the kernel holds for the state: `N IR rules: R kernel rules, E set and map elements`.
pub fn kernel_size(state: &HostState) -> String {
    table_size(&state.nft)
}

/// [`kernel_size`] of the table of `family`: for IPv6, `ip6 table: ...`, the `ip` table's
/// size after it.
pub fn kernel_size_in(state: &HostState, family: Family) -> String {
    match family {
        Family::V4 => kernel_size(state),
        Family::V6 => format!(
            "ip6 table: {}; ip table: {}",
            table_size(&state.nft6),
            table_size(&state.nft)
        ),
    }
}

fn table_size(table: &NftTable) -> String {
    let planned = kuport_core::render::layout(table);
    let rules: usize = planned.layout.chains.values().map(|c| c.rules.len()).sum();
    format!(
        "{} IR rules: {rules} kernel rules, {} set and map elements",
        ir_rules(table),
        planned.layout.element_count()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_plans_one_rule_per_mapping_with_the_target_last() {
        for n in [1, 2, 300, 5_000] {
            let state = host_state(&snapshot(n, false).unwrap(), true).unwrap();
            assert!(ir_rules(&state.nft) >= 2 * n, "{n}");
            let moved = host_state(&snapshot(n, true).unwrap(), false).unwrap();
            assert_ne!(state, moved, "{n}");
        }
    }
    #[test]
    fn the_dual_stack_cluster_plans_every_mapping_in_both_tables_with_the_target_last() {
        for n in [1, 2, 300] {
            let snap = snapshot_in(n, false, Family::V6).unwrap();
            let state = host_state_in(&snap, Family::V6, true).unwrap();
            assert!(ir_rules(&state.nft6) >= 2 * n, "{n}");
            // The IPv4 twin of every mapping is there too: the pods are dual-stack.
            let dnat = |f| {
                state
                    .table(f)
                    .rules(ChainId::Pre)
                    .iter()
                    .filter(|r| matches!(r, Rule::Dnat(_)))
                    .count()
            };
            assert_eq!((dnat(Family::V4), dnat(Family::V6)), (n, n));
            assert!(kernel_size_in(&state, Family::V6).starts_with("ip6 table: "));
            let moved = snapshot_in(n, true, Family::V6).unwrap();
            assert_ne!(host_state_in(&moved, Family::V6, false).unwrap(), state);
        }
        assert_eq!(TARGET_POD6.to_string(), "fd00:10:244::af4:c802");
    }
}
