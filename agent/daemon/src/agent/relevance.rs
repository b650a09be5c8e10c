//! Which watch events can change what a pass does.
//!
//! Every watch event used to run a pass on every node: a kubelet's heartbeat on any Node,
//! another node refreshing its row's pass time, a PortMap status written by the one node that
//! writes it. A pass reads only part of each object (the plan, the facts query and the status
//! writes together), so an event changing nothing of that part is no reason to pass. What a
//! pass reads of each kind, and so what an event must change to run one:
//!
//! - PortMapClass: everything but `resourceVersion` and the `lastPassTime` and `agentVersion`
//!   of the rows. The plan never reads those two (it leaves them out of the row it computes);
//!   the status writes read them only in this node's own row, merging a write into the object
//!   as read at that moment, and a pass that is not run writes nothing.
//! - PortMapNode: likewise, everything but the `agentVersion` and the rows' `lastPassTime` and
//!   `agentVersion`.
//! - PortMap: everything but `resourceVersion` and the status. The plan reads a PortMap's status
//!   only for a mapping this node writes (to keep a condition's transition time), and the
//!   writes compare it with the status wanted. So a change to the status alone matters only to
//!   the node writing it, and to it only when the status is not the one it wants: its own write
//!   coming back runs no pass, someone else's write over it does (to put it back).
//! - Node: its name, whether it is Ready, its InternalIP (`node_is_ready`, `node_internal_ip`),
//!   every address it lists (both families), its pod CIDRs and Cilium's `cilium_host` annotation (endpoints
//!   must be pod addresses): the plan's index reads nothing else of a Node, nor does the facts
//!   query.
//! - Service and Pod: stored trimmed to what the plan reads (NodePorts; this node's Pods'
//!   hostPorts, node, phase, `hostNetwork` and addresses; `trim.rs`), so any change to what is
//!   kept matters.
//! - Namespace: its name and labels (all the plan's index reads).
//! - EndpointSlice: everything but `resourceVersion`, and only of a Service some PortMap refers
//!   to ([`Services`]): a slice of any other Service concerns no pass, created, changed or
//!   deleted, and the agent does not even keep it (`runtime/slices.rs`).
//! - `kube-system/cilium-config`: what `CniFacts::from_cilium_config` reads of it.
//!
//! Only an object replaced in place is judged field by field; one created or deleted, and every
//! object of a relist (the watch starting over), marks the node dirty as before, unless it
//! concerns no pass at all. The test below plans a
//! cluster before and after changing every field said here not to be read, on every node, and
//! gets the same plans: a plan reading one of them later fails it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kuport_core::api::{PortMap, PortMapClass, PortMapNode, PortMapStatus};
use kuport_core::plan::Writes;
use kuport_core::plan::merge::portmap_status_equivalent;
use kuport_core::snapshot::{
    CILIUM_HOST_ANNOTATIONS, CniFacts, SERVICE_NAME_LABEL, node_internal_ip, node_is_ready,
};

/// A watched kind, and which of its changes a pass reads.
pub(crate) trait PassInput: kube::Resource<DynamicType = ()> + Clone + Sized {
    /// Whether the store replacing `old` with `new` can change what a pass of this node plans,
    /// applies or writes, given the statuses it wants to write.
    fn changes_a_pass(old: &Self, new: &Self, wanted: &Wanted) -> bool;

    /// Which objects of the kind the agent on `node` watches: all of them unless said here.
    fn watch_config(_node: &str) -> watcher::Config {
        watcher::Config::default()
    }
}

/// `o` without its `resourceVersion`, which changes with every write whatever it changed.
fn unversioned<K: kube::Resource + Clone>(o: &K) -> K {
    let mut o = o.clone();
    o.meta_mut().resource_version = None;
    o
}

impl PassInput for PortMapClass {
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        fn read(class: &PortMapClass) -> PortMapClass {
            let mut class = unversioned(class);
            for row in class.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
                row.last_pass_time = None;
                row.agent_version = None;
            }
            class
        }
        read(old) != read(new)
    }
}

impl PassInput for PortMapNode {
    /// As a class's rows: everything but the pass times and versions (and `resourceVersion`).
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        fn read(object: &PortMapNode) -> PortMapNode {
            let mut object = unversioned(object);
            object.spec.agent_version = None;
            for entry in &mut object.spec.classes {
                entry.row.last_pass_time = None;
                entry.row.agent_version = None;
            }
            object
        }
        read(old) != read(new)
    }
}

impl PassInput for PortMap {
    fn changes_a_pass(old: &Self, new: &Self, wanted: &Wanted) -> bool {
        fn read(pm: &PortMap) -> PortMap {
            let mut pm = unversioned(pm);
            pm.status = None;
            pm
        }
        if read(old) != read(new) {
            return true;
        }
        if old.status == new.status {
            return false;
        }
        let (Some(namespace), Some(name)) = (
            new.metadata.namespace.as_deref(),
            new.metadata.name.as_deref(),
        ) else {
            return true;
        };
        let status = new.status.clone().unwrap_or_default();
        wanted.differs(namespace, name, &status).unwrap_or(false)
    }
}

impl PassInput for Node {
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        // Besides readiness and the InternalIP, every address of either family (no endpoint may be one), the
        // pod CIDRs (endpoints must be inside one) and Cilium's cilium_host annotation (nor the
        // CNI's gateway).
        let read = |n: &Node| {
            let spec = n.spec.as_ref();
            let gateway: Vec<Option<String>> = CILIUM_HOST_ANNOTATIONS
                .iter()
                .map(|k| n.metadata.annotations.as_ref()?.get(*k).cloned())
                .collect();
            // Both families: an IPv6 InternalIP is a client address the plan translates.
            let mut addresses: Vec<std::net::IpAddr> = n
                .status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .filter_map(|a| a.address.trim().parse().ok())
                .collect();
            addresses.sort_unstable();
            (
                n.metadata.name.clone(),
                node_is_ready(n),
                node_internal_ip(n),
                addresses,
                spec.and_then(|s| s.pod_cidr.clone()),
                spec.and_then(|s| s.pod_cidrs.clone()),
                gateway,
            )
        };
        read(old) != read(new)
    }
}

impl PassInput for Service {
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        unversioned(old) != unversioned(new)
    }
}

impl PassInput for Pod {
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        unversioned(old) != unversioned(new)
    }

    /// Only this node's Pods hold hostPorts here.
    fn watch_config(node: &str) -> watcher::Config {
        watcher::Config::default().fields(&format!("spec.nodeName={node}"))
    }
}

impl PassInput for Namespace {
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        let read = |ns: &Namespace| (ns.metadata.name.clone(), ns.metadata.labels.clone());
        read(old) != read(new)
    }
}

impl PassInput for EndpointSlice {
    /// Judged only for a slice of a Service some PortMap refers to: the slice watch keeps no
    /// other (`runtime/slices.rs`), since the plan reads a slice only as the endpoints of a
    /// PortMap's Service.
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        unversioned(old) != unversioned(new)
    }
}

impl PassInput for ConfigMap {
    fn changes_a_pass(old: &Self, new: &Self, _: &Wanted) -> bool {
        CniFacts::from_cilium_config(old) != CniFacts::from_cilium_config(new)
    }
}

/// A Service, by namespace and name.
pub(crate) type ServiceKey = (String, String);

/// A set of Services by namespace and name: the ones some PortMap refers to, the only ones
/// whose EndpointSlices concern a pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Services(BTreeMap<String, BTreeSet<String>>);

impl Services {
    /// The Services `portmaps` refer to (each by its namespace and `spec.serviceRef.name`).
    pub fn of<'a>(portmaps: impl IntoIterator<Item = &'a PortMap>) -> Self {
        let mut services = Self::default();
        for pm in portmaps {
            if let Some(namespace) = pm.metadata.namespace.as_deref() {
                services.insert(namespace, &pm.spec.service_ref.name);
            }
        }
        services
    }

    pub fn insert(&mut self, namespace: &str, name: &str) {
        if !self.contains(namespace, name) {
            self.0
                .entry(namespace.to_owned())
                .or_default()
                .insert(name.to_owned());
        }
    }

    pub fn remove(&mut self, namespace: &str, name: &str) {
        if let Some(names) = self.0.get_mut(namespace) {
            names.remove(name);
            if names.is_empty() {
                self.0.remove(namespace);
            }
        }
    }

    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.0.get(namespace).is_some_and(|n| n.contains(name))
    }

    /// Whether `slice` lists endpoints of one of these Services (a slice without the label
    /// naming its Service lists nobody's).
    pub fn holds(&self, slice: &EndpointSlice) -> bool {
        slice_service(slice).is_some_and(|(namespace, name)| self.contains(namespace, name))
    }

    /// How many Services.
    pub fn len(&self) -> usize {
        self.0.values().map(BTreeSet::len).sum()
    }

    /// Every Service, sorted by namespace and name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .flat_map(|(ns, names)| names.iter().map(move |n| (ns.as_str(), n.as_str())))
    }

    /// What `wanted` adds to these Services, and what it leaves out of them, each sorted.
    pub fn changes_to(
        &self,
        wanted: &BTreeSet<(&str, &str)>,
    ) -> (Vec<ServiceKey>, Vec<ServiceKey>) {
        let owned = |(ns, name): (&str, &str)| (ns.to_owned(), name.to_owned());
        let added = wanted
            .iter()
            .filter(|(ns, name)| !self.contains(ns, name))
            .map(|k| owned(*k))
            .collect();
        let dropped = self
            .iter()
            .filter(|k| !wanted.contains(k))
            .map(owned)
            .collect();
        (added, dropped)
    }
}

/// The Service `slice` lists endpoints of: its namespace and the value of its
/// `kubernetes.io/service-name` label.
pub(crate) fn slice_service(slice: &EndpointSlice) -> Option<(&str, &str)> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((slice.metadata.namespace.as_deref()?, name.as_str()))
}

/// The Services `portmaps` refer to, borrowed: what a pass compares with the Services whose
/// slices the agent keeps.
pub(crate) fn referred_services<'a>(
    portmaps: impl IntoIterator<Item = &'a PortMap>,
) -> BTreeSet<(&'a str, &'a str)> {
    portmaps
        .into_iter()
        .filter_map(|pm| {
            let namespace = pm.metadata.namespace.as_deref()?;
            Some((namespace, pm.spec.service_ref.name.as_str()))
        })
        .collect()
}

/// The writes this node last handed to the status task: the PortMap statuses it wants.
/// Shared between the pass loop, which sets it, and the watches, which read it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Wanted(Arc<Mutex<WantedWrites>>);

#[derive(Debug, Default)]
struct WantedWrites {
    writes: Arc<Writes>,
    /// The plan sorts its PortMap writes by namespace and name; a pass hook may not keep them
    /// sorted, and then lookups go one by one.
    sorted: bool,
}

impl Wanted {
    /// The writes a pass handed over.
    pub fn set(&self, writes: Arc<Writes>) {
        let sorted = writes
            .portmaps
            .is_sorted_by(|a, b| (&a.namespace, &a.name) <= (&b.namespace, &b.name));
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = WantedWrites { writes, sorted };
    }

    /// `None` when this node does not write the status of PortMap `namespace/name`; otherwise
    /// whether the status it wants says something else than `status`.
    fn differs(&self, namespace: &str, name: &str, status: &PortMapStatus) -> Option<bool> {
        let wanted = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let portmaps = &wanted.writes.portmaps;
        let write = if wanted.sorted {
            portmaps
                .binary_search_by(|w| {
                    (w.namespace.as_str(), w.name.as_str()).cmp(&(namespace, name))
                })
                .ok()
                .map(|i| &portmaps[i])
        } else {
            portmaps
                .iter()
                .find(|w| w.namespace == namespace && w.name == name)
        }?;
        Some(!portmap_status_equivalent(&write.status, status))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, NodeCondition, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kuport_core::plan::{Plan, plan};
    use kuport_core::snapshot::{HostFacts, Snapshot};
    use kuport_testkit::cluster::{Cluster, facts, now, pm, vxlan_spec};
    use serde_json::{Value, json};

    use super::super::trim::Trim;
    use super::*;

    /// Two accepting edges (edge-a serves) and the pod on worker-b, with the rows, a landed
    /// claim and the CNI's config: every kind the plan reads, each with fields it does not.
    fn cluster() -> Cluster {
        Cluster::new()
            .node("edge-a", "100.64.0.1")
            .node("edge-c", "100.64.0.3")
            .node("worker-b", "100.64.0.2")
            .namespace("games", json!({"team": "a"}))
            .class_json(
                "public",
                vxlan_spec(&[("edge-a", &["wt0"]), ("edge-c", &["wt0"])]),
                Value::Null,
            )
            .row("public", "edge-a", json!({"wt0": "100.64.0.1"}), 1400)
            .row("public", "edge-c", json!({"wt0": "100.64.0.3"}), 1400)
            // The NodePort's mapping must be one the class weighs to make a claim.
            .without_system_reserved("public")
            .claim("public", "edge-a/worker-b", 0)
            .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
            .portmap(pm("games", "gs", "public", 3000))
            .portmap(pm("games", "np", "public", 31000).tcp())
            .node_port_service("shop", "web", "TCP", 31000)
            .host_port_pod("ingress", "nginx-0", "edge-a", "TCP", 8443, None)
            .portmap(pm("games", "hp", "public", 8443).tcp())
            .cni_port(8472)
    }

    fn facts_of(node: &str) -> HostFacts {
        match node {
            "edge-a" => facts(&[("wt0", "100.64.0.1")], "wt0", 1400),
            "edge-c" => facts(&[("wt0", "100.64.0.3")], "wt0", 1400),
            _ => facts(&[], "wt0", 1400),
        }
    }

    const NODES: [&str; 3] = ["edge-a", "edge-c", "worker-b"];

    fn plan_of(snapshot: &Snapshot, node: &str) -> Plan {
        plan(snapshot, node, &facts_of(node), now())
    }

    fn wanted_of(plan: &Plan) -> Wanted {
        let wanted = Wanted::default();
        wanted.set(Arc::new(plan.writes.clone()));
        wanted
    }

    fn time(at: &str) -> Time {
        Time(at.parse().expect("timestamp"))
    }

    /// Every object of `snapshot` with a new `resourceVersion` and every field this module
    /// says a pass does not read changed; a PortMap's status only when `node` does not write
    /// it (`writer`).
    fn touch_unread(snapshot: &Snapshot, node: &str, writer: Option<&str>) -> Snapshot {
        let mut s = snapshot.clone();
        for n in &mut s.nodes {
            n.metadata.resource_version = Some("901".into());
            n.metadata.labels = Some([("zone".to_owned(), "b".to_owned())].into());
            n.metadata.annotations = Some([("note".to_owned(), "x".to_owned())].into());
            let spec = n.spec.get_or_insert_with(Default::default);
            spec.unschedulable = Some(true);
            spec.taints = Some(vec![Taint {
                key: "dedicated".into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }]);
            let status = n.status.get_or_insert_with(Default::default);
            for c in status.conditions.iter_mut().flatten() {
                c.last_heartbeat_time = Some(time("2026-06-01T11:59:00Z"));
                c.last_transition_time = Some(time("2026-05-01T00:00:00Z"));
                c.reason = Some("KubeletReady".into());
                c.message = Some("kubelet is posting ready status".into());
            }
            status
                .conditions
                .get_or_insert_with(Vec::new)
                .push(NodeCondition {
                    type_: "MemoryPressure".into(),
                    status: "True".into(),
                    ..NodeCondition::default()
                });
            status.addresses.get_or_insert_with(Vec::new).push(
                k8s_openapi::api::core::v1::NodeAddress {
                    type_: "Hostname".into(),
                    address: "host".into(),
                },
            );
            status.capacity = Some(
                [(
                    "cpu".to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
                )]
                .into(),
            );
        }
        for ns in &mut s.namespaces {
            ns.metadata.resource_version = Some("902".into());
            ns.metadata.annotations = Some([("owner".to_owned(), "x".to_owned())].into());
            ns.status.get_or_insert_with(Default::default).phase = Some("Active".into());
        }
        for class in &mut s.classes {
            class.metadata.resource_version = Some("903".into());
            for row in class.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
                row.last_pass_time = Some(time("2026-06-01T11:58:00Z"));
                row.agent_version = Some("0.0.9".into());
            }
        }
        for slice in &mut s.endpoint_slices {
            slice.metadata.resource_version = Some("904".into());
        }
        // What trimming drops from Services and Pods (a pass sees them trimmed).
        for svc in &mut s.services {
            svc.metadata.resource_version = Some("906".into());
            svc.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
            let spec = svc.spec.get_or_insert_with(Default::default);
            spec.selector = Some([("app".to_owned(), "web".to_owned())].into());
            spec.cluster_ip = Some("10.96.0.9".into());
            for p in spec.ports.iter_mut().flatten() {
                p.name = Some("renamed".into());
                p.target_port = Some(IntOrString::Int(9090));
            }
        }
        for pod in &mut s.pods {
            pod.metadata.resource_version = Some("907".into());
            pod.metadata.labels = Some([("app".to_owned(), "nginx".to_owned())].into());
            let spec = pod.spec.get_or_insert_with(Default::default);
            for c in &mut spec.containers {
                c.image = Some("nginx:2".into());
                c.env = Some(vec![EnvVar {
                    name: "TOKEN".into(),
                    value: Some("secret".into()),
                    ..EnvVar::default()
                }]);
            }
            spec.containers.push(Container {
                name: "sidecar".into(),
                ports: Some(vec![ContainerPort {
                    container_port: 9000,
                    ..ContainerPort::default()
                }]),
                ..Container::default()
            });
            // The Pod's addresses are read (endpoints go only to the node's own Pods); the
            // node's address in its status is not.
            pod.status.get_or_insert_with(Default::default).host_ip = Some("10.0.0.9".into());
        }
        for p in &mut s.portmaps {
            p.metadata.resource_version = Some("905".into());
            if writer != Some(node) {
                p.status = Some(PortMapStatus {
                    conditions: vec![Condition {
                        type_: "Programmed".into(),
                        status: "False".into(),
                        reason: "Whatever".into(),
                        message: "written by another node".into(),
                        last_transition_time: time("2026-06-01T11:00:00Z"),
                        observed_generation: Some(7),
                    }],
                    ..PortMapStatus::default()
                });
            }
        }
        s
    }

    fn trimmed<K: Trim + Clone>(o: &K) -> K {
        let mut o = o.clone();
        o.trim();
        o
    }

    fn pairs<'a, K>(a: &'a [K], b: &'a [K]) -> impl Iterator<Item = (&'a K, &'a K)> {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b)
    }

    #[test]
    fn what_is_said_not_to_be_read_changes_no_plan_and_runs_no_pass() {
        let base = cluster().snapshot;
        let serving = plan_of(&base, "edge-a");
        assert!(
            !serving.host_state.links.is_empty()
                && !serving.writes.portmaps.is_empty()
                && !serving.writes.class_rows.is_empty(),
            "the cluster exercises links, PortMap and class writes: {:?}",
            serving.host_state.links
        );
        // The stores keep Services and Pods trimmed: the plan must not tell the difference.
        let mut stored = base.clone();
        stored.services = stored.services.iter().map(trimmed).collect();
        stored.pods = stored.pods.iter().map(trimmed).collect();
        let held: Vec<String> = serving
            .writes
            .class_rows
            .iter()
            .flat_map(|r| r.row.held_ports.iter().map(|h| h.holder.clone()))
            .collect();
        assert_eq!(
            held,
            [
                "hostPort of Pod ingress/nginx-0",
                "NodePort of Service shop/web"
            ],
            "the cluster exercises held NodePorts and hostPorts"
        );
        for node in NODES {
            assert_eq!(
                plan_of(&stored, node),
                plan_of(&base, node),
                "{node}: trimmed"
            );
        }
        for node in NODES {
            let before = plan_of(&base, node);
            let writer = before.portmaps[0].status_writer.clone();
            let touched = touch_unread(&base, node, writer.as_deref());
            assert_eq!(
                plan_of(&touched, node),
                before,
                "{node}: the plan read a field said not to be read"
            );
            let wanted = wanted_of(&before);
            let unchanged = |what: &str, changes: bool| {
                assert!(
                    !changes,
                    "{node}: {what}: an unread change would run a pass"
                );
            };
            for (a, b) in pairs(&base.nodes, &touched.nodes) {
                unchanged("Node", Node::changes_a_pass(a, b, &wanted));
            }
            for (a, b) in pairs(&base.namespaces, &touched.namespaces) {
                unchanged("Namespace", Namespace::changes_a_pass(a, b, &wanted));
            }
            for (a, b) in pairs(&base.classes, &touched.classes) {
                unchanged("PortMapClass", PortMapClass::changes_a_pass(a, b, &wanted));
            }
            for (a, b) in pairs(&base.endpoint_slices, &touched.endpoint_slices) {
                unchanged(
                    "EndpointSlice",
                    EndpointSlice::changes_a_pass(a, b, &wanted),
                );
            }
            for (a, b) in pairs(&base.portmaps, &touched.portmaps) {
                unchanged("PortMap", PortMap::changes_a_pass(a, b, &wanted));
            }
            for (a, b) in pairs(&base.services, &touched.services) {
                unchanged(
                    "Service",
                    Service::changes_a_pass(&trimmed(a), &trimmed(b), &wanted),
                );
            }
            for (a, b) in pairs(&base.pods, &touched.pods) {
                unchanged(
                    "Pod",
                    Pod::changes_a_pass(&trimmed(a), &trimmed(b), &wanted),
                );
            }
        }
    }

    #[test]
    fn what_a_pass_reads_runs_one() {
        let base = cluster().snapshot;
        let wanted = Wanted::default();
        let node = &base.nodes[0];
        let mut not_ready = node.clone();
        for c in not_ready
            .status
            .iter_mut()
            .flat_map(|s| s.conditions.iter_mut().flatten())
        {
            c.status = "False".into();
        }
        assert!(Node::changes_a_pass(node, &not_ready, &wanted));
        let mut moved = node.clone();
        for a in moved
            .status
            .iter_mut()
            .flat_map(|s| s.addresses.iter_mut().flatten())
        {
            a.address = "100.64.0.9".into();
        }
        assert!(Node::changes_a_pass(node, &moved, &wanted));

        let ns = &base.namespaces[0];
        let mut relabelled = ns.clone();
        relabelled.metadata.labels = Some([("team".to_owned(), "b".to_owned())].into());
        assert!(Namespace::changes_a_pass(ns, &relabelled, &wanted));

        let class = &base.classes[0];
        let mut unclaimed = class.clone();
        if let Some(s) = unclaimed.status.as_mut() {
            s.links.clear();
        }
        assert!(PortMapClass::changes_a_pass(class, &unclaimed, &wanted));
        let mut row_down = class.clone();
        if let Some(s) = row_down.status.as_mut() {
            s.nodes[1].ready = false;
        }
        assert!(PortMapClass::changes_a_pass(class, &row_down, &wanted));

        let slice = &base.endpoint_slices[0];
        let mut unready = slice.clone();
        for e in unready.endpoints.iter_mut().flatten() {
            e.conditions.get_or_insert_with(Default::default).ready = Some(false);
        }
        assert!(EndpointSlice::changes_a_pass(slice, &unready, &wanted));

        let mut recidr = node.clone();
        recidr.spec.get_or_insert_with(Default::default).pod_cidrs =
            Some(vec!["10.9.0.0/24".into()]);
        assert!(Node::changes_a_pass(node, &recidr, &wanted));
        let mut external = node.clone();
        external
            .status
            .get_or_insert_with(Default::default)
            .addresses
            .get_or_insert_with(Vec::new)
            .push(k8s_openapi::api::core::v1::NodeAddress {
                type_: "ExternalIP".into(),
                address: "198.51.100.9".into(),
            });
        assert!(Node::changes_a_pass(node, &external, &wanted));
        // An IPv6 InternalIP is a client address the plan translates, and no endpoint may be
        // a node's IPv6 address either.
        let mut dual_stack = node.clone();
        dual_stack
            .status
            .get_or_insert_with(Default::default)
            .addresses
            .get_or_insert_with(Vec::new)
            .push(k8s_openapi::api::core::v1::NodeAddress {
                type_: "InternalIP".into(),
                address: "fd00:100:64::9".into(),
            });
        assert!(Node::changes_a_pass(node, &dual_stack, &wanted));
        let mut gateway = node.clone();
        gateway.metadata.annotations = Some(
            [(
                CILIUM_HOST_ANNOTATIONS[0].to_owned(),
                "10.244.0.77".to_owned(),
            )]
            .into(),
        );
        assert!(Node::changes_a_pass(node, &gateway, &wanted));

        let svc = trimmed(&base.services[0]);
        let mut renumbered = svc.clone();
        for p in renumbered
            .spec
            .iter_mut()
            .flat_map(|s| s.ports.iter_mut().flatten())
        {
            p.node_port = Some(31001);
        }
        assert!(Service::changes_a_pass(
            &svc,
            &trimmed(&renumbered),
            &wanted
        ));
        let pod = trimmed(&base.pods[0]);
        let mut finished = pod.clone();
        finished.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
        assert!(Pod::changes_a_pass(&pod, &trimmed(&finished), &wanted));

        let cm = |data: Value| -> ConfigMap {
            serde_json::from_value(json!({"metadata": {"name": "cilium-config"}, "data": data}))
                .expect("config map")
        };
        let tunnel = cm(json!({"tunnel-port": "8472"}));
        assert!(ConfigMap::changes_a_pass(
            &tunnel,
            &cm(json!({"tunnel-port": "8473"})),
            &wanted
        ));
        assert!(!ConfigMap::changes_a_pass(
            &tunnel,
            &cm(json!({"tunnel-port": "8472", "debug": "true"})),
            &wanted
        ));
    }

    #[test]
    fn a_portmap_status_runs_a_pass_only_on_its_writer_and_only_when_not_the_one_it_wants() {
        let base = cluster().snapshot;
        let writes = plan_of(&base, "edge-a");
        assert_eq!(
            writes.portmaps[0].status_writer.as_deref(),
            Some("edge-a"),
            "the serving node writes the status"
        );
        let wanted = writes.writes.portmaps[0].status.clone();
        let stored = &base.portmaps[0];
        let with = |status: PortMapStatus| {
            let mut p = stored.clone();
            p.metadata.resource_version = Some("77".into());
            p.status = Some(status);
            p
        };
        let echo = with(wanted.clone());
        let mut other = wanted.clone();
        other.conditions[0].message = "someone else's words".into();
        let other = with(other);
        let on = |node: &str, new: &PortMap| {
            PortMap::changes_a_pass(stored, new, &wanted_of(&plan_of(&base, node)))
        };
        assert!(!on("edge-a", &echo), "the writer's own write coming back");
        assert!(on("edge-a", &other), "the writer puts its status back");
        for node in ["edge-c", "worker-b"] {
            assert!(!on(node, &other), "{node} does not write it");
        }
        // A spec change matters to every node.
        let mut respec = stored.clone();
        respec.spec.port = 3001;
        assert!(on("worker-b", &respec));
    }

    /// `snapshot` as the agent holds it: only the slices of the Services its PortMaps refer to.
    fn as_kept(snapshot: &Snapshot) -> Snapshot {
        let referenced = Services::of(&snapshot.portmaps);
        let mut kept = snapshot.clone();
        kept.endpoint_slices.retain(|s| referenced.holds(s));
        kept
    }

    /// A small deterministic generator (xorshift64), so each seed replays exactly.
    struct Draw(u64);

    impl Draw {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// One generated slice event on `snapshot`: a slice of a Service drawn from `services`
    /// created, replaced (another address, node or readiness) or deleted. Returns the slice
    /// before and after (`None` for absent), with the snapshot changed.
    fn slice_event(
        snapshot: &mut Snapshot,
        draw: &mut Draw,
        services: &[(&str, &str)],
        n: usize,
    ) -> (Option<EndpointSlice>, Option<EndpointSlice>) {
        let (namespace, service) = services[draw.below(services.len())];
        let of_service: Vec<usize> = (0..snapshot.endpoint_slices.len())
            .filter(|i| {
                let s = &snapshot.endpoint_slices[*i];
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SERVICE_NAME_LABEL))
                        == Some(&service.to_owned())
            })
            .collect();
        let node = NODES[draw.below(NODES.len())];
        let address = format!("10.244.1.{}", 10 + draw.below(5));
        let ready = draw.below(2) == 0;
        let fresh = |name: &str| -> EndpointSlice {
            let ep = kuport_testkit::objects::endpoint(&address, node)
                .pod(namespace, &format!("{service}-pod"))
                .ready(ready);
            let mut slice: EndpointSlice = serde_json::from_value(
                kuport_testkit::objects::slice(namespace, name, service)
                    .port("game", "UDP", 3000)
                    .endpoint(ep)
                    .object(),
            )
            .expect("slice");
            slice.metadata.resource_version = Some(format!("{}", 1000 + n));
            slice
        };
        let before = match (of_service.is_empty(), draw.below(3)) {
            (true, _) | (false, 0) => None,
            (false, _) => Some(of_service[draw.below(of_service.len())]),
        };
        let Some(at) = before else {
            let new = fresh(&format!("{service}-gen-{n}"));
            snapshot.endpoint_slices.push(new.clone());
            return (None, Some(new));
        };
        let old = snapshot.endpoint_slices[at].clone();
        if draw.below(2) == 0 {
            snapshot.endpoint_slices.remove(at);
            return (Some(old), None);
        }
        let new = fresh(old.metadata.name.as_deref().unwrap_or_default());
        snapshot.endpoint_slices[at] = new.clone();
        (Some(old), Some(new))
    }

    /// Slices of Services no PortMap refers to are skipped whatever happens to them, and a
    /// skipped event never changes any node's plan (generated events, each plan compared with a
    /// full pass's); events on a referred-to Service's slices run passes, and change plans. And
    /// the agent, which keeps no slice of any other Service, plans as if it kept them all.
    #[test]
    fn a_slice_of_a_service_no_portmap_refers_to_concerns_no_pass() {
        let services = [
            ("games", "gs"),
            ("games", "np"),
            ("games", "lobby"),
            ("shop", "gs"),
            ("shop", "web"),
        ];
        let (mut skipped, mut concerned, mut plans_changed) = (0, 0, 0);
        for seed in 1..=8u64 {
            let mut snapshot = cluster().snapshot;
            let referenced = Services::of(&snapshot.portmaps);
            let mut draw = Draw(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for n in 0..40 {
                let before: Vec<Plan> = NODES.iter().map(|nd| plan_of(&snapshot, nd)).collect();
                let (old, new) = slice_event(&mut snapshot, &mut draw, &services, n);
                let concerns = [old, new].iter().flatten().any(|s| referenced.holds(s));
                let after: Vec<Plan> = NODES.iter().map(|nd| plan_of(&snapshot, nd)).collect();
                let kept = as_kept(&snapshot);
                for (node, plan) in NODES.iter().zip(&after) {
                    assert_eq!(
                        &plan_of(&kept, node),
                        plan,
                        "seed {seed}, event {n}: {node} planned otherwise without the slices it does not keep"
                    );
                }
                if concerns {
                    concerned += 1;
                    plans_changed += usize::from(before != after);
                } else {
                    skipped += 1;
                    assert_eq!(
                        before, after,
                        "seed {seed}, event {n}: a skipped slice event changed a plan"
                    );
                }
            }
        }
        assert!(
            skipped > 50 && concerned > 50,
            "{skipped} skipped, {concerned} not"
        );
        assert!(
            plans_changed > 10,
            "only {plans_changed} events changed a plan"
        );
    }

    #[test]
    fn services_follow_the_portmaps() {
        let snapshot = cluster().snapshot;
        let services = Services::of(&snapshot.portmaps);
        // gs, hp and np of games: a PortMap's Service is named after it in `pm()`.
        assert_eq!(
            services.iter().collect::<Vec<_>>(),
            [("games", "gs"), ("games", "hp"), ("games", "np")]
        );
        assert_eq!(services.len(), 3);
        let mut wanted = referred_services(&snapshot.portmaps);
        assert_eq!(services.changes_to(&wanted), (vec![], vec![]));
        wanted.remove(&("games", "np"));
        wanted.insert(("shop", "web"));
        let key = |ns: &str, n: &str| (ns.to_owned(), n.to_owned());
        assert_eq!(
            services.changes_to(&wanted),
            (vec![key("shop", "web")], vec![key("games", "np")])
        );
        let mut changed = services.clone();
        changed.insert("shop", "web");
        changed.remove("games", "np");
        changed.remove("games", "np");
        assert_eq!(changed.changes_to(&wanted), (vec![], vec![]));
        let gs = &snapshot.endpoint_slices[0];
        assert!(services.holds(gs));
        let mut unlabelled = gs.clone();
        unlabelled.metadata.labels = None;
        assert!(!services.holds(&unlabelled), "a slice naming no Service");
        let mut elsewhere = gs.clone();
        elsewhere.metadata.namespace = Some("shop".into());
        assert!(
            !services.holds(&elsewhere),
            "the same name in another namespace"
        );
    }
}
