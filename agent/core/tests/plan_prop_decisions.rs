//! Property tests of the per-PortMap decisions: a reason for every PortMap, no hostile interface
//! name on any host, one status writer per PortMap, port conflicts as the spec defines them, the
//! endpoint the spec picks in either family (a dual-stack mapping's IPv6 address its IPv4 pod's
//! own), each family's rules in its own table, and published addresses in exactly the families
//! the endpoint serves.
//!
//! The cluster model is in `common/model.rs`, its objects in `common/inputs.rs`, the
//! oracles in `common/oracles.rs`; cases per property:
//! `KUPORT_PROPTEST_CASES` (default 1000).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use kuport_core::ir::Family;
use kuport_core::plan::{AcceptedReason, Detail, plan_with};
use proptest::prelude::*;

use common::inputs::*;
use common::model::*;
use common::oracles::*;

proptest! {
    #![proptest_config(config())]

    /// (d) Every PortMap gets an Accepted reason; invalid specs are never accepted; Programmed is
    /// present exactly when Accepted is Valid.
    #[test]
    fn every_portmap_gets_a_reason(m in model()) {
        let snap = snapshot(&m);
        let wanted: BTreeSet<(String, String)> = m
            .portmaps
            .iter()
            .map(|p| (p.namespace.to_owned(), p.name.to_owned()))
            .collect();
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            let got: BTreeSet<(String, String)> = p
                .portmaps
                .iter()
                .map(|d| (d.namespace.to_string(), d.name.clone()))
                .collect();
            prop_assert_eq!(p.portmaps.len(), m.portmaps.len());
            prop_assert_eq!(&got, &wanted);
            for d in &p.portmaps {
                let spec = m
                    .portmaps
                    .iter()
                    .find(|s| s.namespace == d.namespace && s.name == d.name)
                    .expect("decision of a known PortMap");
                if let Some(why) = spec_is_invalid(&m, spec) {
                    prop_assert_ne!(
                        d.accepted.reason, AcceptedReason::Valid,
                        "{}/{} accepted although {}", d.namespace, d.name, why
                    );
                }
                if !d.accepted.is_true() {
                    prop_assert!(!d.accepted.message.is_empty(), "{}/{}: empty message", d.namespace, d.name);
                }
                prop_assert_eq!(
                    d.programmed.is_some(), d.accepted.is_true(),
                    "{}/{}: programmed {:?} with accepted {:?}",
                    d.namespace, d.name, d.programmed, d.accepted
                );
            }
        }
    }

    /// (d') No hostile interface name reaches any node's datapath: not the nft text, not a
    /// link, not a sysctl; the mappings that would bind one are refused with a reason.
    #[test]
    fn hostile_interface_names_never_reach_the_host(m in model()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            let text = kuport_core::render::nft_text(&p.host_state.nft)
                + &kuport_core::render::nft_text(&p.host_state.nft6);
            for name in HOSTILE_IFACES.iter().filter(|n| !n.is_empty()) {
                prop_assert!(
                    !text.contains(&format!("\"{name}\"")),
                    "node {}: {:?} in the table:\n{}", node, name, text
                );
            }
            for iface in p.host_state.valid_mark_interfaces.iter().chain(p.host_state.links.iter().filter_map(|l| l.device.as_ref())) {
                prop_assert!(!HOSTILE_IFACES.contains(&iface.as_str()), "node {}: {:?}", node, iface);
            }
        }
    }

    /// (e) At most one node writes each PortMap's status, and it is the decision's status writer.
    #[test]
    fn one_status_writer_per_portmap(m in model()) {
        let snap = snapshot(&m);
        let mut writers: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
        let mut decided: BTreeMap<(String, String), Option<String>> = BTreeMap::new();
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            for w in &p.writes.portmaps {
                writers.entry((w.namespace.clone(), w.name.clone())).or_default().push(node);
            }
            for d in &p.portmaps {
                decided.insert((d.namespace.to_string(), d.name.clone()), d.status_writer.as_deref().map(str::to_owned));
            }
        }
        for (key, nodes) in &writers {
            prop_assert_eq!(nodes.len(), 1, "{:?} written by {:?}", key, nodes);
            let writer = decided.get(key).cloned().flatten();
            prop_assert_eq!(writer.as_deref(), Some(nodes[0]), "{:?}", key);
        }
    }

    /// (node, interface) both could bind, and each `PortConflict` names an earlier accepted
    /// mapping that does.
    #[test]
    fn conflicts_follow_the_spec(m in model()) {
        let snap = snapshot(&m);
        let p = plan_of(&m, &snap, GHOST);
        let spec = |d: &kuport_core::plan::MappingDecision| {
            m.portmaps
                .iter()
                .find(|s| s.namespace == d.namespace && s.name == d.name)
                .expect("decision of a known PortMap")
        };
        let order = |s: &PmM| {
            (
                s.created.map(|t| t.parse::<Timestamp>().expect("time")),
                s.namespace,
                s.name,
            )
        };
        let bind = |s: &PmM| -> BTreeSet<(String, String)> {
            let class = class_of(&snap, s.class);
            class
                .spec
                .nodes
                .iter()
                .flat_map(|(n, c)| c.interfaces.iter().map(move |i| (n.clone(), i.clone())))
                .filter(|(_, i)| s.interfaces.is_empty() || s.interfaces.contains(&i.as_str()))
                .collect()
        };
        let clash = |a: &kuport_core::plan::MappingDecision, b: &kuport_core::plan::MappingDecision| {
            let (Some(pa), Some(pb)) = (a.ports, b.ports) else {
                return false;
            };
            a.protocol == b.protocol
                && pa.overlaps(&pb)
                && !bind(spec(a)).is_disjoint(&bind(spec(b)))
        };
        let accepted: Vec<_> = p.portmaps.iter().filter(|d| d.accepted.is_true()).collect();
        for (i, a) in accepted.iter().enumerate() {
            for b in &accepted[i + 1..] {
                prop_assert!(
                    !clash(a, b),
                    "{}/{} and {}/{} are both accepted but clash", a.namespace, a.name, b.namespace, b.name
                );
            }
        }
        for d in p.portmaps.iter().filter(|d| d.accepted.reason == AcceptedReason::PortConflict) {
            prop_assert!(
                accepted.iter().any(|a| order(spec(a)) < order(spec(d)) && clash(a, d)),
                "{}/{} refused with {:?} but no earlier accepted mapping clashes",
                d.namespace, d.name, d.accepted.message
            );
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// (k) Every accepted mapping's endpoint is the one the spec picks, in either family
    /// (`expected_endpoint`): the Service's IPv4 endpoints when any IPv4 slice lists its port,
    /// else its IPv6 ones (an IPv6-only Service); and a dual-stack mapping's IPv6 address is
    /// its IPv4 pod's own: an IPv6 slice of the Service lists that very pod at it, on the same
    /// node, with the same pod port.
    #[test]
    fn endpoints_follow_the_oracle_in_both_families(m in model()) {
        let snap = snapshot(&m);
        let p = plan_of(&m, &snap, GHOST);
        for d in p.portmaps.iter().filter(|d| d.accepted.is_true()) {
            let pm = portmap_of(&snap, &d.namespace, &d.name);
            let got = d.endpoint.as_ref().map(EndpointM::of);
            prop_assert_eq!(&got, &expected_endpoint(&snap, pm), "{}/{}", d.namespace, d.name);
            let Some((ep, address6)) = got.as_ref().and_then(|e| Some((e, e.address6?))) else {
                continue;
            };
            prop_assert!(ep.address.is_ipv4(), "{}/{}: {:?}", d.namespace, d.name, ep);
            let same_pod = snap
                .endpoint_slices
                .iter()
                .filter(|s| s.address_type == "IPv6" && s.metadata.namespace == pm.metadata.namespace)
                .filter(|s| s.ports.iter().flatten().any(|port| port.port == Some(i32::from(ep.port))))
                .flat_map(|s| s.endpoints.iter().flatten())
                .any(|e| {
                    e.addresses.first().and_then(|a| a.parse().ok()) == Some(address6)
                        && e.node_name.as_deref() == Some(ep.node.as_str())
                        && e.target_ref.as_ref().and_then(|t| t.name.as_deref()) == ep.pod.as_deref()
                });
            prop_assert!(same_pod, "{}/{}: {} is not pod {:?}'s", d.namespace, d.name, address6, ep.pod);
        }
    }

    /// (l) No table mixes families, on any node: every address a rule of `ip kuport` names is
    /// IPv4 and every one of `ip6 kuport` IPv6 (the link guard only in the IPv4 table, a
    /// link-peer SNAT only between the ends of one of the node's links, in IPv6 never for the
    /// node's own address); each DNAT, hairpin and identity SNAT sends a mapping's packets only to
    /// its pod's address in the table's family or to the far end, in that family, of the link
    /// toward its pod; each steering rule captures only an address this node has in that
    /// family; ip rules and routes keep to their family, IPv6 ones only beside an `ip6` table.
    #[test]
    fn each_family_keeps_to_its_own_table(m in model_or_linked()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            let facts = host_facts(&m, node);
            let faults: Vec<String> = Family::ALL
                .into_iter()
                .flat_map(|f| table_family_faults(&p, &facts, f))
                .chain(routing_family_faults(&p))
                .collect();
            prop_assert!(faults.is_empty(), "node {}: {:#?}", node, faults);
        }
    }

    /// (n) A mapping is published in exactly the families its endpoint serves: each row names
    /// an IPv4 address only for an endpoint with one and an IPv6 address only for an endpoint
    /// served over IPv6; this node's own rows name its interface's address in each such family
    /// (and nothing where it has none).
    #[test]
    fn published_addresses_follow_the_endpoints_families(m in model_or_linked()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let p = plan_of(&m, &snap, node);
            let facts = host_facts(&m, node);
            for d in &p.portmaps {
                let Some(ep) = &d.endpoint else { continue };
                let (v4, v6) = (ep.v4().is_some(), ep.v6().is_some());
                for row in d.published.iter() {
                    let mut want = (row.address.clone(), row.address6.clone());
                    if row.node == node {
                        let text = |a: Option<String>, serves: bool| a.filter(|_| serves).unwrap_or_default();
                        want = (
                            text(facts.interface_address(&row.interface).map(|a| a.to_string()), v4),
                            text(facts.interface_address6(&row.interface).map(|a| a.to_string()), v6),
                        );
                    }
                    let families_ok = (v4 || row.address.is_empty()) && (v6 || row.address6.is_empty());
                    prop_assert!(
                        families_ok && (row.address.clone(), row.address6.clone()) == want,
                        "node {}: {}/{} (endpoint {:?}) publishes {:?}, want {:?}",
                        node, d.namespace, d.name, ep, row, want
                    );
                }
            }
        }
    }

    /// The agent's pass ([`Detail::Written`]) is `kuport plan`'s ([`Detail::Full`]) with the
    /// condition messages and published rows left out only for the mappings another node
    /// writes the status of: the same reasons, endpoints, links, rules and writes, and every
    /// sentence this node writes.
    #[test]
    fn the_agents_pass_leaves_out_only_what_other_nodes_write(m in model()) {
        let snap = snapshot(&m);
        for node in plan_nodes(&m) {
            let full = plan_of(&m, &snap, node);
            let lean = plan_with(&snap, node, &host_facts(&m, node), now(), Detail::Written);
            let mut expected = full.clone();
            for d in &mut expected.portmaps {
                if d.status_writer.as_deref() == Some(node) {
                    continue;
                }
                if let Some(p) = d.programmed.as_mut() {
                    p.message.clear();
                }
                d.published = std::sync::Arc::from([]);
            }
            prop_assert_eq!(&lean, &expected, "node {}", node);
            // Whatever this node writes is spelled out in full.
            prop_assert_eq!(&lean.writes, &full.writes);
        }
    }
}
