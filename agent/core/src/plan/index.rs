//! Sorted lookup structures over the snapshot, built once per pass.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;

use crate::api::{ClassNodeStatus, PortMap, PortMapClass};
use crate::snapshot::{CniFacts, Snapshot, node_internal_ip, node_is_ready};

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A node as the plan needs it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub ready: bool,
    pub internal_ip: Option<Ipv4Addr>,
}

/// Lookups over the snapshot. Every map is a BTreeMap, so iteration is sorted.
pub struct Index<'a> {
    pub nodes: BTreeMap<&'a str, NodeInfo>,
    pub namespaces: BTreeMap<&'a str, &'a BTreeMap<String, String>>,
    pub classes: BTreeMap<&'a str, &'a PortMapClass>,
    /// Class rows by (class, node).
    pub rows: BTreeMap<(&'a str, &'a str), &'a ClassNodeStatus>,
    /// EndpointSlices by (namespace, service name).
    pub slices: BTreeMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
    /// PortMaps in conflict order: creation time, then namespace, then name.
    pub portmaps: Vec<&'a PortMap>,
    pub cni: Option<&'a CniFacts>,
}

impl<'a> Index<'a> {
    pub fn build(snapshot: &'a Snapshot) -> Self {
        let mut nodes = BTreeMap::new();
        for node in &snapshot.nodes {
            if let Some(name) = node.metadata.name.as_deref() {
                let info = NodeInfo {
                    ready: node_is_ready(node),
                    internal_ip: node_internal_ip(node),
                };
                // Duplicate names cannot come from an API server; keep the first deterministically
                // by preferring the entry that sorts first on (ready, ip).
                nodes
                    .entry(name)
                    .and_modify(|old: &mut NodeInfo| {
                        if (info.ready, info.internal_ip) > (old.ready, old.internal_ip) {
                            *old = info.clone();
                        }
                    })
                    .or_insert(info);
            }
        }
        let namespaces = snapshot
            .namespaces
            .iter()
            .filter_map(|ns| {
                Some((
                    ns.metadata.name.as_deref()?,
                    ns.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
                ))
            })
            .collect();
        let mut classes = BTreeMap::new();
        for class in &snapshot.classes {
            if let Some(name) = class.metadata.name.as_deref() {
                classes.entry(name).or_insert(class);
            }
        }
        let mut rows = BTreeMap::new();
        for (name, class) in &classes {
            for row in class.status.iter().flat_map(|s| s.nodes.iter()) {
                rows.entry((*name, row.name.as_str())).or_insert(row);
            }
        }
        let mut slices: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
        for slice in &snapshot.endpoint_slices {
            let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
            else {
                continue;
            };
            slices.entry((ns, svc.as_str())).or_default().push(slice);
        }
        let mut portmaps: Vec<&PortMap> = snapshot.portmaps.iter().collect();
        portmaps.sort_by(|a, b| conflict_key(a).cmp(&conflict_key(b)));
        // The API server cannot hold two objects with one name; an offline dump can. Keep the
        // earliest, so the result does not depend on input order.
        let mut seen = BTreeSet::new();
        portmaps.retain(|pm| seen.insert(conflict_key(pm).1));
        Index {
            nodes,
            namespaces,
            classes,
            rows,
            slices,
            portmaps,
            cni: snapshot.cni.as_ref(),
        }
    }

    /// The class's accepting nodes: named in the class, with a Ready Node object, sorted.
    pub fn accepting_nodes(&self, class: &PortMapClass) -> Vec<&'a str> {
        class
            .spec
            .nodes
            .keys()
            .filter_map(|name| self.nodes.get_key_value(name.as_str()))
            .filter(|(_, info)| info.ready)
            .map(|(name, _)| *name)
            .collect()
    }

    pub fn internal_ip(&self, node: &str) -> Option<Ipv4Addr> {
        self.nodes.get(node).and_then(|n| n.internal_ip)
    }

    /// The first Node in the cluster by name.
    pub fn first_node(&self) -> Option<&'a str> {
        self.nodes.keys().next().copied()
    }

    pub fn row(&self, class: &str, node: &str) -> Option<&'a ClassNodeStatus> {
        self.rows.get(&(class, node)).copied()
    }
}

/// (creationTimestamp, (namespace, name)): a missing timestamp sorts first.
fn conflict_key(pm: &PortMap) -> (Option<Timestamp>, (&str, &str)) {
    (
        pm.metadata.creation_timestamp.as_ref().map(|t| t.0),
        (
            pm.metadata.namespace.as_deref().unwrap_or_default(),
            pm.metadata.name.as_deref().unwrap_or_default(),
        ),
    )
}
