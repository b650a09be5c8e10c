//! Sorted lookup structures over the snapshot, built once per pass.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::collections::hash_map::Entry;
use std::net::{Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;

use super::fast_hash::{FastMap, FastSet};
use super::holders::{self, Holder};
use super::node_rows::NodeRows;
use super::pod_network::{AddressPolicy, PodAddresses};
use super::selector;
use crate::api::{ClassNode, ClassNodeStatus, PortMap, PortMapClass, ReturnPathMode};
use crate::keys::Name;
use crate::snapshot::{
    CniFacts, SERVICE_NAME_LABEL, Snapshot, node_internal_ip, node_internal_ip6, node_is_ready,
};

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// A node as the plan needs it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub ready: bool,
    pub internal_ip: Option<Ipv4Addr>,
    /// The first IPv6 InternalIP, on a dual-stack node (a client address, never a link's
    /// underlay: links run over IPv4).
    pub internal_ip6: Option<Ipv6Addr>,
}

/// Lookups over the snapshot. The maps that are iterated are BTreeMaps, so iteration is sorted;
/// the ones asked once or more per mapping (namespaces, rows, slices, held rows, invalid
/// interface names) are hash tables, only ever looked up.
pub struct Index<'a> {
    pub nodes: BTreeMap<&'a str, NodeInfo>,
    pub namespaces: FastMap<&'a str, &'a BTreeMap<String, String>>,
    pub classes: BTreeMap<&'a str, &'a PortMapClass>,
    /// The same classes, for the lookup each PortMap makes by its class name, with the class's
    /// shared name (the one lookup finds both).
    pub class_by_name: FastMap<&'a str, (&'a PortMapClass, Name)>,
    /// Class rows by (class, node).
    pub rows: FastMap<(&'a str, &'a str), &'a ClassNodeStatus>,
    /// EndpointSlices by (namespace, service name), each Service's in input order.
    pub slices: FastMap<(&'a str, &'a str), ServiceSlices<'a>>,
    /// Every Service by (namespace, name). Only asked for membership.
    pub services: FastSet<(&'a str, &'a str)>,
    /// Whether `services` is every Service ([`Snapshot::services_listed`]).
    pub services_listed: bool,
    /// The listed Pods' addresses by node: the endpoint's node delivers only to its own.
    pub pod_addresses: PodAddresses<'a>,
    /// PortMaps in conflict order: creation time, then namespace, then name.
    pub portmaps: Vec<&'a PortMap>,
    pub cni: Option<&'a CniFacts>,
    /// Per class, its nodes whose rows report host sockets, in the class's node order: the
    /// only rows a mapping's host-clash check has to read.
    pub held_rows: FastMap<&'a str, Vec<HeldRow<'a>>>,
    /// Per class, the first interface name among its nodes' lists that kuport refuses, if any.
    pub invalid_class_interface: FastMap<&'a str, &'a str>,
    /// UDP ports every node depends on (each Vxlan class's link port, the CNI's overlay port)
    /// with what holds them, sorted.
    pub node_udp_ports: Vec<(u16, String)>,
    /// Every Service's NodePorts: held on every node.
    pub node_ports: Vec<Holder>,
    /// The hostPorts of the Pods in the snapshot, by node.
    pub host_ports: BTreeMap<&'a str, Vec<Holder>>,
    /// Which endpoint addresses mappings may deliver to.
    pub addresses: AddressPolicy<'a>,
    /// The names of nodes, classes and namespaces, each allocated once per pass and shared by
    /// every decision that holds it. Only looked up.
    names: FastMap<&'a str, Name>,
    /// What each class's namespace selector said of each namespace asked about, by class then
    /// namespace: thousands of mappings share a few (class, namespace) pairs. Only looked up.
    selections: RefCell<FastMap<String, FastMap<String, Selection>>>,
}

/// What a class's namespace selector says of one namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Selected (or the class selects every namespace).
    Selected,
    /// The namespace has no Namespace object, so no selector can match it.
    NotFound,
    /// The selector does not match the namespace's labels.
    NotSelected,
    /// The selector cannot be parsed: it selects nothing.
    Unparsable,
}

/// The EndpointSlices of one Service, in input order. Nearly every Service has one: it is held
/// without a list of its own (a list per Service was an allocation per PortMap).
pub struct ServiceSlices<'a> {
    first: &'a EndpointSlice,
    rest: Vec<&'a EndpointSlice>,
}

impl<'a> ServiceSlices<'a> {
    pub fn iter(&self) -> impl Iterator<Item = &'a EndpointSlice> + '_ {
        std::iter::once(self.first).chain(self.rest.iter().copied())
    }
}

/// A class node whose row reports host sockets.
pub struct HeldRow<'a> {
    pub node: &'a str,
    pub class_node: &'a ClassNode,
    pub row: &'a ClassNodeStatus,
}

impl<'a> Index<'a> {
    pub fn build(snapshot: &'a Snapshot) -> Self {
        let nodes = nodes_by_name(snapshot);
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
        let rows = rows_by_class_and_node(&classes, &NodeRows::new(&snapshot.portmap_nodes));
        let slices = slices_by_service(snapshot);
        let mut portmaps: Vec<&PortMap> = snapshot.portmaps.iter().collect();
        let service_created = service_creation_times(snapshot);
        portmaps.sort_by_cached_key(|pm| conflict_key(pm, &service_created));
        // The API server cannot hold two objects with one name; an offline dump can. Keep the
        // earliest, so the result does not depend on input order.
        // Only membership is asked of this set, so its hash order reaches no output.
        let mut seen = FastSet::default();
        seen.reserve(portmaps.len());
        portmaps.retain(|pm| seen.insert(mapping_name(pm)));
        let held_rows = classes
            .iter()
            .map(|(name, class)| (*name, held_rows_of(name, class, &rows)))
            .collect();
        let invalid_class_interface = classes
            .iter()
            .filter_map(|(name, class)| Some((*name, first_invalid_class_interface(class)?)))
            .collect();
        let cni = snapshot.cni.as_ref();
        let addresses = AddressPolicy::build(&snapshot.nodes, &classes, &rows, cni);
        let names = shared_names(&nodes, &namespaces, &classes);
        let class_by_name = classes
            .iter()
            .map(|(n, c)| {
                (
                    *n,
                    (*c, names.get(n).cloned().unwrap_or_else(|| Name::from(*n))),
                )
            })
            .collect();
        Index {
            names,
            services: service_names(snapshot),
            services_listed: snapshot.services_listed,
            pod_addresses: PodAddresses::build(&snapshot.pods, snapshot.pods_listed),
            node_udp_ports: node_udp_ports(&classes, cni),
            node_ports: holders::node_ports(&snapshot.services),
            host_ports: holders::host_ports(&snapshot.pods),
            addresses,
            nodes,
            namespaces,
            class_by_name,
            classes,
            rows,
            slices,
            portmaps,
            cni,
            held_rows,
            invalid_class_interface,
            selections: RefCell::default(),
        }
    }

    /// `text` as a shared [`Name`]: the pass's copy for a node, class or namespace it knows, a
    /// new one for any other text.
    pub fn name(&self, text: &str) -> Name {
        match self.names.get(text) {
            Some(name) => name.clone(),
            None => Name::from(text),
        }
    }

    /// What the namespace selector of `class` (named `class_name`) says of `namespace`,
    /// worked out once per pass for each pair.
    pub fn namespace_selection(
        &self,
        class: &PortMapClass,
        class_name: &str,
        namespace: &str,
    ) -> Selection {
        let selector = class.spec.namespace_selector.as_ref();
        let (false, Some(selector)) = (selector::is_empty(selector), selector) else {
            return Selection::Selected;
        };
        let mut selections = self.selections.borrow_mut();
        if let Some(known) = selections.get(class_name).and_then(|c| c.get(namespace)) {
            return *known;
        }
        let selection = match self.namespaces.get(namespace) {
            None => Selection::NotFound,
            Some(labels) => match selector::matches(selector, labels) {
                Some(true) => Selection::Selected,
                Some(false) => Selection::NotSelected,
                None => Selection::Unparsable,
            },
        };
        selections
            .entry(class_name.to_owned())
            .or_default()
            .insert(namespace.to_owned(), selection);
        selection
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

    /// The first IPv6 InternalIP of `node`, if it has one.
    pub fn internal_ip6(&self, node: &str) -> Option<Ipv6Addr> {
        self.nodes.get(node).and_then(|n| n.internal_ip6)
    }

    /// The first Node in the cluster by name.
    pub fn first_node(&self) -> Option<&'a str> {
        self.nodes.keys().next().copied()
    }

    /// Whether the Service `namespace/name` exists, as far as the snapshot tells: its object,
    /// or an EndpointSlice naming it (a Service may list its endpoints in slices a tenant
    /// wrote); any name when the snapshot does not list the Services.
    pub fn service_exists(&self, namespace: &str, name: &str) -> bool {
        !self.services_listed
            || self.services.contains(&(namespace, name))
            || self.slices.contains_key(&(namespace, name))
    }

    pub fn row(&self, class: &str, node: &str) -> Option<&'a ClassNodeStatus> {
        self.rows.get(&(class, node)).copied()
    }
}

/// Every class's rows that count (`node_rows`), by (class, node).
fn rows_by_class_and_node<'a>(
    classes: &BTreeMap<&'a str, &'a PortMapClass>,
    node_rows: &NodeRows<'a>,
) -> FastMap<(&'a str, &'a str), &'a ClassNodeStatus> {
    let by_class: Vec<(&'a str, Vec<&'a ClassNodeStatus>)> = classes
        .iter()
        .map(|(name, class)| (*name, node_rows.rows_of(class)))
        .collect();
    // Sized up front: growing a map of thousands rehashes it several times.
    let row_count = by_class.iter().map(|(_, rows)| rows.len()).sum();
    let mut rows = FastMap::with_capacity_and_hasher(row_count, Default::default());
    for (name, class_rows) in by_class {
        for row in class_rows {
            rows.entry((name, row.name.as_str())).or_insert(row);
        }
    }
    rows
}

/// Every Service's (namespace, name).
fn service_names(snapshot: &Snapshot) -> FastSet<(&str, &str)> {
    snapshot
        .services
        .iter()
        .filter_map(|svc| {
            let meta = &svc.metadata;
            Some((meta.namespace.as_deref()?, meta.name.as_deref()?))
        })
        .collect()
}

/// One [`Name`] for each node (a Node object's or one a class names), class and namespace.
fn shared_names<'a>(
    nodes: &BTreeMap<&'a str, NodeInfo>,
    namespaces: &FastMap<&'a str, &'a BTreeMap<String, String>>,
    classes: &BTreeMap<&'a str, &'a PortMapClass>,
) -> FastMap<&'a str, Name> {
    let class_nodes = classes.values().flat_map(|c| c.spec.nodes.keys());
    let texts = (nodes.keys().copied())
        .chain(namespaces.keys().copied())
        .chain(classes.keys().copied())
        .chain(class_nodes.map(String::as_str));
    let mut names = FastMap::with_capacity_and_hasher(texts.size_hint().0, Default::default());
    for text in texts {
        names.entry(text).or_insert_with(|| Name::from(text));
    }
    names
}

/// Each Node's readiness and InternalIP, by name.
fn nodes_by_name(snapshot: &Snapshot) -> BTreeMap<&str, NodeInfo> {
    let mut nodes = BTreeMap::new();
    for node in &snapshot.nodes {
        if let Some(name) = node.metadata.name.as_deref() {
            let info = NodeInfo {
                ready: node_is_ready(node),
                internal_ip: node_internal_ip(node),
                internal_ip6: node_internal_ip6(node),
            };
            // Duplicate names cannot come from an API server; keep the first deterministically
            // by preferring the entry that sorts first on (ready, ip).
            nodes
                .entry(name)
                .and_modify(|old: &mut NodeInfo| {
                    let rank = |n: &NodeInfo| (n.ready, n.internal_ip, n.internal_ip6);
                    if rank(&info) > rank(old) {
                        *old = info.clone();
                    }
                })
                .or_insert(info);
        }
    }
    nodes
}

/// The EndpointSlices of each Service, by (namespace, Service name).
fn slices_by_service(snapshot: &Snapshot) -> FastMap<(&str, &str), ServiceSlices<'_>> {
    let mut slices: FastMap<(&str, &str), ServiceSlices> =
        FastMap::with_capacity_and_hasher(snapshot.endpoint_slices.len(), Default::default());
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
        match slices.entry((ns, svc.as_str())) {
            Entry::Occupied(mut more) => more.get_mut().rest.push(slice),
            Entry::Vacant(first) => {
                first.insert(ServiceSlices {
                    first: slice,
                    rest: Vec::new(),
                });
            }
        }
    }
    slices
}

fn held_rows_of<'a>(
    class_name: &'a str,
    class: &'a PortMapClass,
    rows: &FastMap<(&'a str, &'a str), &'a ClassNodeStatus>,
) -> Vec<HeldRow<'a>> {
    class
        .spec
        .nodes
        .iter()
        .filter_map(|(node, class_node)| {
            let row = rows.get(&(class_name, node.as_str()))?;
            (!row.held_ports.is_empty()).then_some(HeldRow {
                node,
                class_node,
                row,
            })
        })
        .collect()
}

fn first_invalid_class_interface(class: &PortMapClass) -> Option<&str> {
    class
        .spec
        .nodes
        .values()
        .flat_map(|n| n.interfaces.iter())
        .map(String::as_str)
        .filter(|name| !crate::api::valid_interface_name(name))
        .min()
}

fn node_udp_ports(
    classes: &BTreeMap<&str, &PortMapClass>,
    cni: Option<&CniFacts>,
) -> Vec<(u16, String)> {
    let mut holders: Vec<(u16, String)> = classes
        .iter()
        .filter(|(_, c)| c.spec.return_path.mode == ReturnPathMode::Vxlan)
        .filter_map(|(name, c)| {
            let port = u16::try_from(c.spec.return_path.vxlan.port).ok()?;
            Some((port, format!("the return links of class {name}")))
        })
        .collect();
    if let Some(cni) = cni {
        holders.push((
            cni.vxlan_port,
            format!("the overlay of the CNI ({})", cni.name),
        ));
    }
    holders.sort();
    holders
}

/// (creationTimestamp, (namespace, name)): a missing timestamp sorts first.
/// A PortMap's place in conflict order: the later of its own creation time and its Service's,
/// then its namespace and name. A PortMap holds no port while its Service is missing
/// (`ServiceNotFound`), so when the Service comes it must not take back a port a mapping
/// accepted meanwhile: it counts as created with its Service.
fn conflict_key<'p>(
    pm: &'p PortMap,
    service_created: &FastMap<(&str, &str), Timestamp>,
) -> (Option<Timestamp>, (&'p str, &'p str)) {
    let (namespace, _) = mapping_name(pm);
    let own = pm.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let service = service_created
        .get(&(namespace, pm.spec.service_ref.name.as_str()))
        .copied();
    (own.max(service), mapping_name(pm))
}

fn mapping_name(pm: &PortMap) -> (&str, &str) {
    (
        pm.metadata.namespace.as_deref().unwrap_or_default(),
        pm.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// Each Service's creation time, by (namespace, name). Only looked up.
fn service_creation_times(snapshot: &Snapshot) -> FastMap<(&str, &str), Timestamp> {
    snapshot
        .services
        .iter()
        .filter_map(|svc| {
            let meta = &svc.metadata;
            let created = meta.creation_timestamp.as_ref()?.0;
            Some(((meta.namespace.as_deref()?, meta.name.as_deref()?), created))
        })
        .collect()
}
