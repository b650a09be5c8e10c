//! What the plan's property tests compare the plan against: independent readings of the model
//! and of a plan.

use kuport_core::api::{LinkClaim, PortMap, PortMapClass};
use kuport_core::plan::Plan;
use kuport_core::snapshot::Snapshot;

use super::model::*;

/// Mirrors the plan's notion of a well-formed claim key: two distinct, non-empty node names in
/// bytewise order joined by one `/`.
pub fn well_formed_key(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty() && a < b && !b.contains('/'))
}

pub fn class_of<'a>(snap: &'a Snapshot, name: &str) -> &'a PortMapClass {
    snap.classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .expect("class exists")
}

/// The PortMap of a decision, as the plan read it.
pub fn portmap_of<'a>(snap: &'a Snapshot, namespace: &str, name: &str) -> &'a PortMap {
    snap.portmaps
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
        .expect("decision of a known PortMap")
}

/// The claims of a class as the plan read them from its status.
pub fn claims_of<'a>(snap: &'a Snapshot, class: &str) -> &'a [LinkClaim] {
    class_of(snap, class)
        .status
        .as_ref()
        .map_or(&[], |s| s.links.as_slice())
}

pub fn pair_key(a: &str, b: &str) -> String {
    if a <= b {
        format!("{a}/{b}")
    } else {
        format!("{b}/{a}")
    }
}

/// The global part of a plan: mappings with published addresses (of both families) blanked,
/// and each class's name, Ready and generation.
pub type GlobalPart = (
    Vec<kuport_core::plan::MappingDecision>,
    Vec<(String, String, String, Option<i64>)>,
);

pub fn global_part(p: &Plan) -> GlobalPart {
    let mut portmaps = p.portmaps.clone();
    for d in &mut portmaps {
        let mut rows = d.published.to_vec();
        for row in &mut rows {
            row.address.clear();
            row.address6.clear();
        }
        d.published = rows.into();
    }
    let classes = p
        .classes
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                c.ready.reason.as_str().to_owned(),
                c.ready.message.clone(),
                c.generation,
            )
        })
        .collect();
    (portmaps, classes)
}

pub fn spec_is_invalid(m: &Model, p: &PmM) -> Option<&'static str> {
    let port_ok = |n: i32| (1..=65535).contains(&n);
    if !m.classes.iter().any(|c| c.name == p.class) {
        return Some("class missing");
    }
    if p.end_port.is_some_and(|e| e < p.port) {
        return Some("endPort < port");
    }
    if !port_ok(p.port) || p.end_port.is_some_and(|e| !port_ok(e)) {
        return Some("port outside 1..65535");
    }
    if binds_hostile(m, p) {
        return Some("a hostile interface name");
    }
    None
}

/// The mapping would bind a hostile name: one of its own interfaces, or, when it names none,
/// one its class gives any node.
pub fn binds_hostile(m: &Model, p: &PmM) -> bool {
    let hostile = |i: &&str| HOSTILE_IFACES.contains(i);
    if !p.interfaces.is_empty() {
        return p.interfaces.iter().any(hostile);
    }
    m.classes
        .iter()
        .filter(|c| c.name == p.class)
        .flat_map(|c| c.nodes.values().flatten())
        .any(hostile)
}
