//! The cluster of the nft and flow measurements: one node, one class, N UDP PortMaps whose pods
//! all run on that node (so no return link is needed and every rule is a nat rule).
//!
//! The mapping the flow measurements send to ([`TARGET_PORT`] → [`TARGET_POD`]) sorts last in
//! both nat chains (highest port in `kup-pre`, highest address in `kup-post`): a new flow to it
//! is checked against every other mapping's rule first, the worst case a linear chain has.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::jiff::Timestamp;
use kuport_core::ir::{ChainId, HostState, Rule};
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
    if n == 0 || n > 9_999 {
        bail!("the bench cluster holds 1 to 9,999 mappings, not {n}");
    }
    let mut snap = Snapshot::default();
    let node = objects::node(NODE, Some(&INTERNAL_IP.to_string()), true);
    snap.nodes
        .push(serde_json::from_value(node).context("building the Node")?);
    let namespace = objects::namespace(NAMESPACE, Value::Null);
    snap.namespaces
        .push(serde_json::from_value(namespace).context("building the Namespace")?);
    let spec = json!({
        "nodes": nodes_json(&[(NODE, &[PUBLIC_IF])]),
        "ports": {"min": 1024, "max": 65535},
        "returnPath": vxlan_return_path(7000, 4790, "169.254.0.0/20")});
    let row = node_row(NODE, json!({PUBLIC_IF: PUBLIC_ADDR.to_string()}), 1500);
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
        let endpoint = endpoint(&pod.to_string(), NODE)
            .ready(true)
            .pod(NAMESPACE, &format!("{name}-0"));
        let slice = slice(NAMESPACE, &format!("{name}-x"), &name)
            .port("game", "UDP", port)
            .endpoint(endpoint);
        snap.endpoint_slices.push(
            serde_json::from_value(slice.object())
                .with_context(|| format!("building the EndpointSlice of {name}"))?,
        );
    }
    Ok(snap)
}

/// The node's desired host state for `snap`, checked to hold one DNAT rule per mapping and,
/// with `target_last`, the target's rules last.
pub fn host_state(snap: &Snapshot, target_last: bool) -> Result<HostState> {
    let p = plan(snap, NODE, &facts(), now()?);
    let dnat: Vec<_> = p
        .host_state
        .nft
        .rules(ChainId::Pre)
        .iter()
        .filter_map(|r| match r {
            Rule::Dnat(d) => Some(d),
            _ => None,
        })
        .collect();
    if dnat.len() != snap.portmaps.len() {
        bail!(
            "the plan emits {} DNAT rules for {} mappings (first decision: {:?})",
            dnat.len(),
            snap.portmaps.len(),
            p.portmaps.first().map(|d| (&d.accepted, &d.programmed))
        );
    }
    let last_pre = dnat.last().map(|d| (d.ports.first, d.to));
    let last_post = p
        .host_state
        .nft
        .rules(ChainId::Post)
        .last()
        .and_then(|r| match r {
            Rule::IdentitySnat(s) => Some((s.ports.first, s.daddr)),
            _ => None,
        });
    let want = Some((TARGET_PORT, std::net::IpAddr::V4(TARGET_POD)));
    if target_last && (last_pre != want || last_post != want) {
        bail!(
            "the target mapping is not last in both nat chains (kup-pre ends with {last_pre:?}, \
             kup-post with {last_post:?})"
        );
    }
    Ok(p.host_state)
}

/// Number of rules in the IR's table (one per mapping and chain).
pub fn rule_count(state: &HostState) -> usize {
    state.nft.chains.iter().map(|(_, r)| r.len()).sum()
}

/// What the kernel holds for the state: `N IR rules: R kernel rules, E set and map elements`.
pub fn kernel_size(state: &HostState) -> String {
    let planned = kuport_core::render::layout(&state.nft);
    let rules: usize = planned.layout.chains.values().map(|c| c.rules.len()).sum();
    format!(
        "{} IR rules: {rules} kernel rules, {} set and map elements",
        rule_count(state),
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
            assert!(rule_count(&state) >= 2 * n, "{n}");
            let moved = host_state(&snapshot(n, true).unwrap(), false).unwrap();
            assert_ne!(state, moved, "{n}");
        }
    }
}
