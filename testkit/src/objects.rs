//! Kubernetes objects as kuport's tests, benches and lab write them: Nodes, Namespaces, PortMaps,
//! PortMapClasses, EndpointSlices and the agent's DaemonSet with its Pods, as JSON.
//!
//! JSON, not typed objects, because the callers need both: the plan tests and benches turn them
//! into `k8s-openapi`/`kuport-core` types, the API tests send them as they are (also shapes the
//! types cannot hold), and the lab writes them through a dynamic client. Every builder writes
//! only the fields it was given, so an object that must lack a field (a slice without its
//! service label, a PortMap without a creation time) is built as it was before.

use serde_json::{Map, Value, json};

/// The group and version of kuport's custom resources.
pub const API_VERSION: &str = "kuport.wlz.li/v1alpha1";
/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The namespace of the agent's DaemonSet in the shipped manifests.
pub const DAEMONSET_NAMESPACE: &str = "kuport-system";
/// The name of the agent's DaemonSet; its Pods are `kuport-agent-<node>`.
pub const AGENT_DAEMONSET: &str = "kuport-agent";
/// The ServiceAccount the agent runs as (in [`DAEMONSET_NAMESPACE`]), as the manifests name it.
pub const AGENT_ACCOUNT: &str = "kuport-agent";

/// `"True"` or `"False"`, as conditions spell a boolean.
fn condition_status(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

/// The pod network every test Node advertises in `spec.podCIDRs`: endpoints of the fixtures
/// lie in it (an endpoint outside every pod network is never used).
pub const POD_NETWORK: &str = "10.244.0.0/16";

/// A Node with one InternalIP (none: no address at all), a Ready condition and the pod CIDR
/// [`POD_NETWORK`].
pub fn node(name: &str, internal_ip: Option<&str>, ready: bool) -> Value {
    let addresses = internal_ip.map_or_else(
        || json!([]),
        |ip| json!([{"type": "InternalIP", "address": ip}]),
    );
    json!({"metadata": {"name": name},
        "spec": {"podCIDR": POD_NETWORK, "podCIDRs": [POD_NETWORK]},
        "status": {
        "addresses": addresses,
        "conditions": [{"type": "Ready", "status": condition_status(ready)}]}})
}

/// A Node's status as kubelet writes it: the InternalIP, and Ready with kubelet's reason and
/// `at` as both transition and heartbeat time (the real node-lifecycle controller reads the
/// heartbeat).
pub fn kubelet_node_status(internal_ip: &str, ready: bool, at: &str) -> Value {
    json!({
        "addresses": [{"type": "InternalIP", "address": internal_ip}],
        "conditions": [{"type": "Ready", "status": condition_status(ready),
                         "reason": if ready {"KubeletReady"} else {"NodeStatusUnknown"},
                         "lastTransitionTime": at,
                         "lastHeartbeatTime": at}],
    })
}

/// A Namespace, with `labels` unless they are null.
pub fn namespace(name: &str, labels: Value) -> Value {
    let mut metadata = json!({"name": name});
    if !labels.is_null() {
        metadata["labels"] = labels;
    }
    json!({"metadata": metadata})
}

/// A kuport custom resource of `kind` (`PortMap`, `PortMapClass`) from its metadata and spec.
pub fn kuport_object(kind: &str, metadata: Value, spec: Value) -> Value {
    json!({"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec})
}

/// Metadata with a creation time and generation when given (an API server sets both itself).
fn metadata(
    name: &str,
    namespace: Option<&str>,
    created: Option<&str>,
    generation: Option<i64>,
) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(name));
    if let Some(ns) = namespace {
        m.insert("namespace".into(), json!(ns));
    }
    if let Some(at) = created {
        m.insert("creationTimestamp".into(), json!(at));
    }
    if let Some(g) = generation {
        m.insert("generation".into(), json!(g));
    }
    Value::Object(m)
}

/// A PortMap under construction (see [`pm`]).
#[derive(Clone, Debug)]
pub struct Pm {
    pub namespace: String,
    pub name: String,
    pub class: String,
    pub protocol: String,
    pub port: i32,
    pub end_port: Option<i32>,
    pub interfaces: Vec<String>,
    pub service: String,
    pub port_name: String,
    pub created: Option<String>,
    pub generation: Option<i64>,
}

/// A UDP PortMap `namespace/name` of `class` on `port`, aimed at the Service of the same name
/// and its port `game`; no creation time or generation until set.
pub fn pm(namespace: &str, name: &str, class: &str, port: i32) -> Pm {
    Pm {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        class: class.to_owned(),
        protocol: "UDP".to_owned(),
        port,
        end_port: None,
        interfaces: Vec::new(),
        service: name.to_owned(),
        port_name: "game".to_owned(),
        created: None,
        generation: None,
    }
}

impl Pm {
    pub fn end(mut self, end: i32) -> Self {
        self.end_port = Some(end);
        self
    }
    pub fn tcp(self) -> Self {
        self.protocol("TCP")
    }
    pub fn protocol(mut self, protocol: &str) -> Self {
        protocol.clone_into(&mut self.protocol);
        self
    }
    pub fn ifaces(mut self, ifaces: &[&str]) -> Self {
        self.interfaces = ifaces.iter().map(|s| (*s).to_owned()).collect();
        self
    }
    pub fn service(mut self, service: &str, port_name: &str) -> Self {
        service.clone_into(&mut self.service);
        port_name.clone_into(&mut self.port_name);
        self
    }
    pub fn created(mut self, at: &str) -> Self {
        self.created = Some(at.to_owned());
        self
    }
    pub fn generation(mut self, generation: i64) -> Self {
        self.generation = Some(generation);
        self
    }

    /// The spec: `endPort` and `interfaces` only when set.
    pub fn spec(&self) -> Value {
        let mut spec = json!({"className": self.class, "protocol": self.protocol,
            "port": self.port, "serviceRef": {"name": self.service, "port": self.port_name}});
        if let Some(end) = self.end_port {
            spec["endPort"] = json!(end);
        }
        if !self.interfaces.is_empty() {
            spec["interfaces"] = json!(self.interfaces);
        }
        spec
    }

    /// The whole object.
    pub fn object(&self) -> Value {
        let meta = metadata(
            &self.name,
            Some(&self.namespace),
            self.created.as_deref(),
            self.generation,
        );
        kuport_object("PortMap", meta, self.spec())
    }
}

/// The PortMap spec the schema and API tests vary: UDP 3000–3009 of class `public`, aimed at
/// `gameserver`'s port `game`.
pub fn base_portmap_spec() -> Value {
    pm("games", "gameserver", "public", 3000).end(3009).spec()
}

/// A PortMapClass under construction (see [`class`]).
#[derive(Clone, Debug)]
pub struct Class {
    pub name: String,
    pub spec: Value,
    pub created: Option<String>,
    pub generation: Option<i64>,
    /// Null: no status.
    pub status: Value,
}

/// A PortMapClass `name` with `spec`; no creation time, generation or status until set.
pub fn class(name: &str, spec: Value) -> Class {
    Class {
        name: name.to_owned(),
        spec,
        created: None,
        generation: None,
        status: Value::Null,
    }
}

impl Class {
    pub fn created(mut self, at: &str) -> Self {
        self.created = Some(at.to_owned());
        self
    }
    pub fn generation(mut self, generation: i64) -> Self {
        self.generation = Some(generation);
        self
    }
    pub fn status(mut self, status: Value) -> Self {
        self.status = status;
        self
    }

    /// The whole object.
    pub fn object(&self) -> Value {
        let meta = metadata(&self.name, None, self.created.as_deref(), self.generation);
        let mut obj = kuport_object("PortMapClass", meta, self.spec.clone());
        if !self.status.is_null() {
            obj["status"] = self.status.clone();
        }
        obj
    }
}

/// The `nodes` map of a class spec: each node with its interfaces.
pub fn nodes_json(nodes: &[(&str, &[&str])]) -> Value {
    let mut map = Map::new();
    for (name, ifaces) in nodes {
        map.insert((*name).to_owned(), json!({"interfaces": ifaces}));
    }
    Value::Object(map)
}

/// A Vxlan class spec over the given nodes and their interfaces.
pub fn vxlan_spec(nodes: &[(&str, &[&str])]) -> Value {
    json!({"nodes": nodes_json(nodes), "returnPath": {"mode": "Vxlan"}})
}

/// A class's `returnPath` in Vxlan mode with its link settings: VNI, UDP port and the subnet
/// its links' /31s come from.
pub fn vxlan_return_path(vni: u32, port: u16, subnet: &str) -> Value {
    json!({"mode": "Vxlan", "vxlan": {"vni": vni, "port": port, "subnet": subnet}})
}

/// A None-mode class spec.
pub fn none_spec(nodes: &[(&str, &[&str])]) -> Value {
    json!({"nodes": nodes_json(nodes), "returnPath": {"mode": "None"}})
}

/// A ready node row of a class status: the interface addresses, the underlay MTU and the
/// link MTU 50 below it (the VXLAN overhead).
pub fn node_row(node: &str, addresses: Value, underlay_mtu: i32) -> Value {
    json!({"name": node, "ready": true, "addresses": addresses,
           "underlayMTU": underlay_mtu, "linkMTU": underlay_mtu - 50})
}

/// A landed link claim of a class status: the pair `key` (`a/b`) at `slot`.
pub fn link_claim(key: &str, slot: impl Into<Value>, subnet: &str) -> Value {
    let peers: Vec<&str> = key.split('/').collect();
    json!({"key": key, "peers": peers, "slot": slot.into(), "subnet": subnet})
}

/// One endpoint of a slice (see [`endpoint`]).
#[derive(Clone, Debug)]
pub struct Endpoint {
    address: String,
    node: String,
    conditions: Map<String, Value>,
    pod: Option<(String, String)>,
}

/// The endpoint `address` on `node`, with no condition and no pod reference until set.
pub fn endpoint(address: &str, node: &str) -> Endpoint {
    Endpoint {
        address: address.to_owned(),
        node: node.to_owned(),
        conditions: Map::new(),
        pod: None,
    }
}

impl Endpoint {
    pub fn ready(self, ready: bool) -> Self {
        self.condition("ready", ready)
    }
    /// A condition (`ready`, `serving`, `terminating`).
    pub fn condition(mut self, name: &str, value: bool) -> Self {
        self.conditions.insert(name.to_owned(), json!(value));
        self
    }
    /// The Pod behind the endpoint (`targetRef`).
    pub fn pod(mut self, namespace: &str, name: &str) -> Self {
        self.pod = Some((namespace.to_owned(), name.to_owned()));
        self
    }

    fn json(&self) -> Value {
        let mut e = json!({"addresses": [self.address], "nodeName": self.node,
                           "conditions": self.conditions});
        if let Some((namespace, name)) = &self.pod {
            e["targetRef"] = json!({"kind": "Pod", "name": name, "namespace": namespace});
        }
        e
    }
}

/// An IPv4 EndpointSlice under construction (see [`slice`]).
#[derive(Clone, Debug)]
pub struct Slice {
    namespace: String,
    name: String,
    labels: Map<String, Value>,
    address_type: &'static str,
    ports: Vec<Value>,
    endpoints: Vec<Value>,
}

/// The EndpointSlice `namespace/name` of Service `service`, with no port or endpoint yet.
pub fn slice(namespace: &str, name: &str, service: &str) -> Slice {
    let mut labels = Map::new();
    labels.insert(SERVICE_NAME_LABEL.to_owned(), json!(service));
    Slice {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        labels,
        address_type: "IPv4",
        ports: Vec::new(),
        endpoints: Vec::new(),
    }
}

impl Slice {
    /// A slice of IPv6 addresses (a dual-stack or IPv6-only Service has one).
    pub fn ipv6(mut self) -> Self {
        self.address_type = "IPv6";
        self
    }
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), json!(value));
        self
    }
    /// A named port.
    pub fn port(mut self, name: &str, protocol: &str, port: impl Into<Value>) -> Self {
        self.ports
            .push(json!({"name": name, "protocol": protocol, "port": port.into()}));
        self
    }
    /// Ports given whole (the lab derives them from its pods).
    pub fn ports(mut self, ports: Vec<Value>) -> Self {
        self.ports.extend(ports);
        self
    }
    pub fn endpoint(mut self, endpoint: Endpoint) -> Self {
        self.endpoints.push(endpoint.json());
        self
    }

    /// The whole object.
    pub fn object(&self) -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels},
            "addressType": self.address_type,
            "ports": self.ports,
            "endpoints": self.endpoints,
        })
    }
}

/// The agent's DaemonSet as the manifests ship it, reduced to what the agent reads (its
/// identity; the Pods point at it).
pub fn agent_daemonset() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": AGENT_DAEMONSET, "namespace": DAEMONSET_NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "kuport"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "kuport"}},
                "spec": {"containers": [{"name": "agent", "image": "kuport"}]},
            },
        },
    })
}

/// The agent's Pod on `node` as the DaemonSet controller makes it: the template's labels and
/// ServiceAccount, and owned by the DaemonSet with uid `daemonset_uid`.
pub fn agent_pod(node: &str, daemonset_uid: &str) -> Value {
    let mut pod = bare_agent_pod(node);
    pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": AGENT_DAEMONSET, "uid": daemonset_uid, "controller": true}]);
    pod
}

/// The agent's Pod on `node` with no owner: what a token for the agent on that node is bound to
/// when no DaemonSet is recorded. It runs as the agent's ServiceAccount and mounts no token
/// (no kubelet runs to project one; the caller asks for a token bound to the Pod).
pub fn bare_agent_pod(node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{AGENT_DAEMONSET}-{node}"), "namespace": DAEMONSET_NAMESPACE,
            "labels": {"app.kubernetes.io/name": "kuport"},
        },
        "spec": {"nodeName": node, "serviceAccountName": AGENT_ACCOUNT,
                 "automountServiceAccountToken": false,
                 "containers": [{"name": "agent", "image": "kuport"}]},
    })
}

/// A Pod of one container bound to `node` (as the scheduler would have), labelled `app` so a
/// Service selects it; it mounts no service-account token (no controller makes one here).
pub fn bound_pod(name: &str, app: &str, node: &str, container: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "automountServiceAccountToken": false,
                 "containers": [container]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_portmap_writes_only_the_fields_it_was_given() {
        let bare = pm("games", "gs", "public", 3000).object();
        assert_eq!(
            bare,
            json!({"apiVersion": API_VERSION, "kind": "PortMap",
                "metadata": {"name": "gs", "namespace": "games"},
                "spec": {"className": "public", "protocol": "UDP", "port": 3000,
                         "serviceRef": {"name": "gs", "port": "game"}}})
        );
        let full = pm("games", "gs", "public", 3000)
            .tcp()
            .end(3002)
            .ifaces(&["eth0"])
            .service("svc", "p")
            .created("2026-01-01T00:00:00Z")
            .generation(2)
            .object();
        assert_eq!(full["metadata"]["generation"], 2);
        assert_eq!(
            full["metadata"]["creationTimestamp"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            full["spec"],
            json!({"className": "public", "protocol": "TCP", "port": 3000, "endPort": 3002,
                   "interfaces": ["eth0"], "serviceRef": {"name": "svc", "port": "p"}})
        );
    }

    #[test]
    fn a_slice_lists_its_ports_and_endpoints_in_order() {
        let s = slice("games", "gs-0", "gs")
            .port("game", "UDP", 3000)
            .endpoint(
                endpoint("10.244.0.5", "n1")
                    .ready(true)
                    .pod("games", "gs-0"),
            )
            .endpoint(endpoint("10.244.0.6", "n2"))
            .object();
        assert_eq!(s["metadata"]["labels"][SERVICE_NAME_LABEL], "gs");
        assert_eq!(
            s["endpoints"],
            json!([
                {"addresses": ["10.244.0.5"], "nodeName": "n1", "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "gs-0", "namespace": "games"}},
                {"addresses": ["10.244.0.6"], "nodeName": "n2", "conditions": {}},
            ])
        );
    }

    #[test]
    fn a_vxlan_return_path_carries_its_link_settings() {
        assert_eq!(
            vxlan_return_path(7000, 4790, "169.254.0.0/20"),
            json!({"mode": "Vxlan", "vxlan": {"vni": 7000, "port": 4790, "subnet": "169.254.0.0/20"}})
        );
    }

    #[test]
    fn a_class_has_a_status_only_when_given_one() {
        let spec = vxlan_spec(&[("n1", &["eth0"])]);
        assert!(class("c", spec.clone()).object().get("status").is_none());
        let row = node_row("n1", json!({"eth0": "203.0.113.1"}), 1450);
        let with = class("c", spec).status(json!({"nodes": [row]})).object();
        assert_eq!(with["status"]["nodes"][0]["linkMTU"], 1400);
    }
}
