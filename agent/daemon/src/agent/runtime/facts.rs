//! What a pass asks of the host: the facts query its plan needs.

use kuport_core::ir::MarkLayout;
use kuport_core::snapshot::{Snapshot, node_internal_ip};
use kuport_host::FactsQuery;

/// The facts this node's plan needs: the interfaces its classes give it, and its InternalIP.
pub(super) fn facts_query(snapshot: &Snapshot, node: &str, marks: MarkLayout) -> FactsQuery {
    let mut interfaces: Vec<String> = snapshot
        .classes
        .iter()
        .filter_map(|c| c.spec.nodes.get(node))
        .flat_map(|n| n.interfaces.iter().cloned())
        .collect();
    interfaces.sort();
    interfaces.dedup();
    let internal_ip = snapshot
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .and_then(node_internal_ip);
    FactsQuery {
        interfaces,
        internal_ip,
        marks,
        agent_ports: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use kuport_testkit::objects::{self, vxlan_spec};
    use serde_json::Value;

    use super::*;

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("object")
    }

    #[test]
    fn the_query_names_the_interfaces_this_nodes_classes_give_it_once_and_its_address() {
        let snapshot = Snapshot {
            classes: vec![
                from(objects::class("a", vxlan_spec(&[("n1", &["wt0", "eth0"])])).object()),
                from(
                    objects::class("b", vxlan_spec(&[("n1", &["eth0"]), ("n2", &["eth9"])]))
                        .object(),
                ),
                from(objects::class("c", vxlan_spec(&[("n2", &["eth8"])])).object()),
            ],
            nodes: vec![
                from(objects::node("n2", Some("10.0.0.2"), true)),
                from(objects::node("n1", Some("10.0.0.1"), true)),
            ],
            ..Snapshot::default()
        };
        let query = facts_query(&snapshot, "n1", MarkLayout::default());
        assert_eq!(query.interfaces, ["eth0", "wt0"]);
        assert_eq!(query.internal_ip, Some("10.0.0.1".parse().expect("ip")));
        assert_eq!(query.marks, MarkLayout::default());
        assert!(query.agent_ports.is_empty(), "the agent adds its own ports");
    }

    #[test]
    fn a_node_no_class_names_and_without_its_node_object_asks_for_nothing() {
        let query = facts_query(&Snapshot::default(), "n1", MarkLayout::default());
        assert!(query.interfaces.is_empty());
        assert_eq!(query.internal_ip, None);
    }
}
