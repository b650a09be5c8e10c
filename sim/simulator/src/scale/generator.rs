//! The cluster the scale harness runs against, generated from a seed: Nodes shaped as kubelets
//! write them, Namespaces, classes, and per PortMap a Service, its EndpointSlice and its Pod;
//! then the churn (pod moves, node flaps). Every choice derives from the seed and the node
//! names as a set, never from the order the names came in, so a run can be repeated exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::OnceLock;

use kuport_core::api::DEFAULT_SYSTEM_RESERVED;

use kuport_sim::apiserver::SplitMix64;
use kuport_testkit::objects::{self, endpoint, nodes_json, vxlan_return_path};
use serde_json::{Value, json};

pub use super::kubelet::{internal_ip, pod_cidr};
use super::kubelet::{lease_object_at, node_object_at, nth};

/// PortMaps per class: every PortMap of a class binds the same interface of every accepting
/// node, so each needs a port of its own there; a larger cluster gets more classes, each on
/// an interface of its own (`eth<k>`).
pub const PORTMAPS_PER_CLASS: usize = 25_000;
/// PortMaps (and their Services) per namespace.
pub const PORTMAPS_PER_NAMESPACE: usize = 100;
/// The first port a class hands out.
const FIRST_PORT: u16 = 5000;

/// What to generate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Every random choice derives from it.
    pub seed: u64,
    /// The cluster's node names (any order).
    pub nodes: Vec<String>,
    /// PortMaps, each with its own Service, EndpointSlice and Pod.
    pub portmaps: usize,
    /// Nodes every class accepts on.
    pub accepting: usize,
    /// Nodes besides the accepting ones whose agents run; the PortMaps' pods are spread over
    /// them (a pod on a node without an agent could never be acknowledged).
    pub pod_agents: usize,
}

/// The generated cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Every node name, sorted.
    pub nodes: Vec<String>,
    /// The nodes the classes accept on, sorted.
    pub accepting: Vec<String>,
    /// The nodes whose agents run besides the accepting ones, sorted: the pods' nodes.
    pub pod_nodes: Vec<String>,
    /// The classes' names.
    pub classes: Vec<String>,
    /// Every object, in the order to create them (Namespaces, Nodes, Leases, classes, then per
    /// PortMap its Service, Pod, EndpointSlice and the PortMap).
    pub objects: Vec<Value>,
    /// Where each PortMap's pod is, by PortMap number.
    pub placement: Vec<String>,
    /// Pods placed on each node so far (the next pod's address follows).
    pub pods_placed: BTreeMap<String, usize>,
}

impl Cluster {
    /// Node `node`'s number in the sorted node list.
    pub fn index(&self, node: &str) -> usize {
        self.nodes
            .binary_search_by(|n| n.as_str().cmp(node))
            .unwrap_or(0)
    }

    /// The address of the next pod placed on `node`.
    pub fn next_pod_ip(&mut self, node: &str) -> Ipv4Addr {
        let index = self.index(node);
        let n = self.pods_placed.entry(node.to_owned()).or_default();
        *n += 1;
        pod_ip(index, *n - 1)
    }
}

/// Node `i`'s name, as the harness names nodes.
pub fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// The address of the `n`th pod placed on node `index` (from .10 of its pod CIDR, 1,000
/// addresses taken in turn).
pub fn pod_ip(index: usize, n: usize) -> Ipv4Addr {
    nth(Ipv4Addr::new(10, 64, 0, 10), index * 1024 + n % 1000)
}

/// The address of interface `eth<class>` on node `index` (198.18.0.0/15, one /24-sized block
/// per class).
pub fn interface_ip(class: usize, index: usize) -> Ipv4Addr {
    nth(
        Ipv4Addr::new(198, 18, 0, 1),
        class * 65_536 + index % 65_536,
    )
}

/// PortMaps a run may add after generating the cluster (the "new PortMap" samples): their
/// ports are kept free in the classes.
pub const SPARE_PORTMAPS: usize = 1000;

/// The number of classes `portmaps` PortMaps need, with room for [`SPARE_PORTMAPS`] more.
pub fn class_count(portmaps: usize) -> usize {
    (portmaps + SPARE_PORTMAPS)
        .div_ceil(PORTMAPS_PER_CLASS)
        .max(1)
}

/// The ports a class hands out, in order: from [`FIRST_PORT`] up, past every port a class
/// keeps back by default (`DEFAULT_SYSTEM_RESERVED`: the nodes' own services, the NodePort
/// range).
fn ports() -> &'static [u16] {
    static PORTS: OnceLock<Vec<u16>> = OnceLock::new();
    PORTS.get_or_init(|| {
        (FIRST_PORT..=u16::MAX)
            .filter(|p| {
                !DEFAULT_SYSTEM_RESERVED.iter().any(|r| {
                    r.port <= i32::from(*p) && i32::from(*p) <= r.end_port.unwrap_or(r.port)
                })
            })
            .take(PORTMAPS_PER_CLASS)
            .collect()
    })
}

/// The class of PortMap `j`, its port, its namespace and its name.
pub fn portmap_place(j: usize) -> (usize, u16, String, String) {
    let class = j / PORTMAPS_PER_CLASS;
    let port = ports()
        .get(j % PORTMAPS_PER_CLASS)
        .copied()
        .unwrap_or(FIRST_PORT);
    let ns = format!("t-{:04}", j / PORTMAPS_PER_NAMESPACE);
    (class, port, ns, format!("pm-{j:06}"))
}

/// Picks `count` of `from` with `rng`, sorted.
fn pick(rng: &mut SplitMix64, from: &[String], count: usize) -> Vec<String> {
    let mut pool = from.to_vec();
    let mut out = Vec::with_capacity(count.min(pool.len()));
    while out.len() < count && !pool.is_empty() {
        out.push(pool.swap_remove(rng.below(pool.len())));
    }
    out.sort();
    out
}

/// Generates the cluster for `shape`.
pub fn generate(shape: &Shape) -> Cluster {
    let nodes: Vec<String> = shape
        .nodes
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut rng = SplitMix64::new(shape.seed ^ 0x5CA1_E000_0000_0001);
    let accepting = pick(&mut rng, &nodes, shape.accepting);
    let rest: Vec<String> = nodes
        .iter()
        .filter(|n| !accepting.contains(n))
        .cloned()
        .collect();
    let pod_nodes = pick(&mut rng, &rest, shape.pod_agents);
    let classes: Vec<String> = (0..class_count(shape.portmaps))
        .map(|k| format!("public-{k}"))
        .collect();
    let mut objects = Vec::new();
    for n in 0..(shape.portmaps + SPARE_PORTMAPS).div_ceil(PORTMAPS_PER_NAMESPACE) {
        let mut namespace = objects::namespace(&format!("t-{n:04}"), Value::Null);
        namespace["apiVersion"] = json!("v1");
        namespace["kind"] = json!("Namespace");
        objects.push(namespace);
    }
    for (index, name) in nodes.iter().enumerate() {
        objects.push(node_object_at(name, index, "2026-01-01T00:00:00Z"));
        objects.push(lease_object_at(name, "2026-01-01T00:00:00.000000Z"));
    }
    for (k, class) in classes.iter().enumerate() {
        objects.push(class_object(class, k, &accepting));
    }
    let mut cluster = Cluster {
        nodes,
        accepting,
        pod_nodes,
        classes,
        objects,
        placement: Vec::with_capacity(shape.portmaps),
        pods_placed: BTreeMap::new(),
    };
    for j in 0..shape.portmaps {
        let homes = if cluster.pod_nodes.is_empty() {
            &cluster.accepting
        } else {
            &cluster.pod_nodes
        };
        let Some(home) = homes.get(rng.below(homes.len().max(1))).cloned() else {
            break;
        };
        let ip = cluster.next_pod_ip(&home);
        let workload = workload(j, &home, ip, &cluster.classes);
        cluster.objects.extend(workload);
        cluster.placement.push(home);
    }
    cluster
}

/// Class `k`: Single, accepting on `accepting` at `eth<k>`, VXLAN return links from a /16 of
/// its own (32,768 link slots).
pub fn class_object(name: &str, k: usize, accepting: &[String]) -> Value {
    let iface = format!("eth{k}");
    let ifaces = [iface.as_str()];
    let nodes: Vec<(&str, &[&str])> = accepting
        .iter()
        .map(|n| (n.as_str(), &ifaces[..]))
        .collect();
    let k8 = u8::try_from(k).unwrap_or(u8::MAX);
    let spec = json!({
        "nodes": nodes_json(&nodes),
        "servingMode": "Single",
        "returnPath": vxlan_return_path(
            // One VNI block of 65,536 each, past its first id (a multiple of 65,536 would
            // equal kuport's local mark).
            65_536 * (u32::from(k8) + 1) + 1,
            4790 + u16::from(k8),
            &format!("100.{}.0.0/16", 64 + k8),
        ),
    });
    objects::class(name, spec).object()
}

/// PortMap `j`'s objects with its pod on `node` at `ip`: Service, Pod, EndpointSlice,
/// PortMap.
pub fn workload(j: usize, node: &str, ip: Ipv4Addr, classes: &[String]) -> Vec<Value> {
    let (class, port, ns, name) = portmap_place(j);
    let service = format!("svc-{j:06}");
    let class = classes.get(class).map_or("public-0", String::as_str);
    let service_object = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service, "namespace": ns},
        "spec": {"type": "ClusterIP", "selector": {"app": service},
                 "ports": [{"name": "game", "protocol": "UDP", "port": 3000,
                            "targetPort": 3000}]},
    });
    vec![
        service_object,
        pod_object(&ns, &service, node, ip),
        slice_object(&ns, &service, node, ip),
        objects::pm(&ns, &name, class, i32::from(port))
            .service(&service, "game")
            .object(),
    ]
}

/// Service `<service>`'s Pod `<service>-0` on `node` at `ip`, Running, as the kubelet reports.
pub fn pod_object(ns: &str, service: &str, node: &str, ip: Ipv4Addr) -> Value {
    let mut pod = objects::bound_pod(
        &format!("{service}-0"),
        service,
        node,
        json!({"name": "game", "image": "registry.example/game:1.0"}),
    );
    pod["metadata"]["namespace"] = json!(ns);
    pod["status"] = json!({"phase": "Running", "podIP": ip.to_string(),
        "podIPs": [{"ip": ip.to_string()}]});
    pod
}

/// Service `<service>`'s EndpointSlice `<service>-x` listing its pod on `node` at `ip`, ready.
pub fn slice_object(ns: &str, service: &str, node: &str, ip: Ipv4Addr) -> Value {
    let pod = endpoint(&ip.to_string(), node)
        .ready(true)
        .pod(ns, &format!("{service}-0"));
    objects::slice(ns, &format!("{service}-x"), service)
        .port("game", "UDP", 3000)
        .endpoint(pod)
        .object()
}
