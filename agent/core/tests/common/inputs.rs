//! From the property tests' cluster model to the plan's inputs: the objects as an API server
//! holds them after the agents' status writes, the host facts of each node, and every input
//! list shuffled.

use kuport_core::api::PortMapClass;
use kuport_core::plan::merge::{
    RowHome, class_parts, merge_class_status, portmap_status_equivalent,
};
use kuport_core::plan::node_rows::NodeRows;
use kuport_core::plan::{Plan, plan};
use kuport_core::snapshot::{CniFacts, HostFacts, Snapshot};
use kuport_testkit::objects;
use serde_json::{Value, json};

use super::model::*;

pub fn node_json(n: &NodeM) -> Value {
    let ip = n.ip.map(|ip| format!("100.64.0.{ip}"));
    let mut node = objects::node(n.name, ip.as_deref(), n.ready);
    if let Some(pod6) = n.pod6
        && let Some(i) = NODES.iter().position(|x| *x == n.name)
        && let Some(cidrs) = node["spec"]["podCIDRs"].as_array_mut()
    {
        cidrs.push(json!(pod_cidr6(i, pod6)));
    }
    let status = &mut node["status"];
    if n.noise
        && let Some(addresses) = status["addresses"].as_array_mut()
    {
        addresses.splice(
            0..0,
            [
                json!({"type": "InternalIP", "address": "fd00::1"}),
                json!({"type": "ExternalIP", "address": "198.51.100.1"}),
            ],
        );
    }
    if let Some(conditions) = status["conditions"].as_array_mut() {
        conditions.insert(0, json!({"type": "MemoryPressure", "status": "False"}));
    }
    node
}

pub fn selector_json(s: &SelM) -> Value {
    let expr = |op: &str, values: Option<&[&str]>| {
        let mut e = json!({"key": "tier", "operator": op});
        if let Some(values) = values {
            e["values"] = json!(values);
        }
        json!({"matchExpressions": [e]})
    };
    match s {
        SelM::Empty => json!({}),
        SelM::Labels(tier) => json!({"matchLabels": {"tier": tier}}),
        SelM::In(values) => expr("In", Some(values)),
        SelM::NotIn(values) => expr("NotIn", Some(values)),
        SelM::Exists => expr("Exists", None),
        SelM::DoesNotExist => expr("DoesNotExist", None),
        SelM::Unknown => expr("Maybe", Some(&["public"])),
        SelM::ExistsWithValues => expr("Exists", Some(&["public"])),
    }
}

pub fn class_json(c: &ClassM) -> Value {
    let nodes: serde_json::Map<String, Value> = c
        .nodes
        .iter()
        .map(|(n, ifaces)| ((*n).to_owned(), json!({"interfaces": ifaces})))
        .collect();
    let mut vxlan = json!({});
    if let Some(vni) = c.vni {
        vxlan["vni"] = json!(vni);
    }
    if let Some(port) = c.port {
        vxlan["port"] = json!(port);
    }
    if let Some(subnet) = &c.subnet {
        vxlan["subnet"] = json!(subnet);
    }
    if let Some(subnet6) = c.subnet6 {
        vxlan["ipv6Subnet"] = json!(subnet6);
    }
    let mut spec = json!({
        "nodes": nodes,
        "servingMode": if c.multi { "Multi" } else { "Single" },
        "returnPath": {"mode": if c.vxlan { "Vxlan" } else { "None" }, "vxlan": vxlan},
    });
    if let Some((min, max, reserved)) = &c.window {
        spec["ports"] = json!({"min": min, "max": max, "reserved": reserved});
    }
    if let Some(sel) = &c.selector {
        spec["namespaceSelector"] = selector_json(sel);
    }
    let mut class = objects::class(c.name, spec).generation(3);
    if let Some(t) = c.created {
        class = class.created(t);
    }
    if !c.rows.is_empty() || !c.claims.is_empty() {
        let rows: Vec<Value> = c
            .rows
            .iter()
            .map(|r| {
                let addresses: serde_json::Map<String, Value> = r
                    .addresses
                    .iter()
                    .map(|(i, a)| ((*i).to_owned(), json!(format!("203.0.113.{a}"))))
                    .collect();
                let mut row = json!({"name": r.node, "ready": r.ready, "addresses": addresses});
                if !r.ready {
                    row["message"] = json!("interface wt0 not present");
                }
                if let Some(mtu) = r.mtu {
                    row["underlayMTU"] = json!(mtu);
                }
                row
            })
            .collect();
        let claims: Vec<Value> = c
            .claims
            .iter()
            .map(|l| {
                let mut claim = objects::link_claim(&l.key, l.slot, "");
                if let Some(t) = l.unused_since {
                    claim["unusedSince"] = json!(t);
                }
                claim
            })
            .collect();
        class = class.status(json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "Valid", "message": "",
                            "lastTransitionTime": TIMES[0]}],
            "nodes": rows, "links": claims}));
    }
    class.object()
}

pub fn portmap_json(p: &PmM) -> Value {
    let mut pm = objects::pm(p.namespace, p.name, p.class, p.port)
        .protocol(if p.tcp { "TCP" } else { "UDP" })
        .service(p.service, p.port_name)
        .ifaces(&p.interfaces)
        .generation(2);
    if let Some(end) = p.end_port {
        pm = pm.end(end);
    }
    if let Some(t) = p.created {
        pm = pm.created(t);
    }
    pm.object()
}

pub fn slice_json(s: &SliceM, i: usize) -> Value {
    let mut metadata = json!({"name": format!("slice-{i}"), "namespace": s.namespace});
    if let Some(svc) = s.service {
        metadata["labels"] = json!({"kubernetes.io/service-name": svc});
    }
    let ports: Vec<Value> = s
        .ports
        .iter()
        .map(|(name, protocol, port)| {
            let mut p = json!({"port": port});
            if let Some(name) = name {
                p["name"] = json!(name);
            }
            if let Some(protocol) = protocol {
                p["protocol"] = json!(protocol);
            }
            p
        })
        .collect();
    let endpoints: Vec<Value> = s
        .endpoints
        .iter()
        .map(|e| {
            let addresses: Vec<String> = e.address.iter().map(|a| a.text(s.ipv6)).collect();
            let mut ep = json!({"addresses": addresses});
            if let Some(node) = e.node {
                ep["nodeName"] = json!(node);
            }
            let mut conditions = json!({});
            if let Some(ready) = e.ready {
                conditions["ready"] = json!(ready);
            }
            ep["conditions"] = conditions;
            if let Some(pod) = e.pod {
                ep["targetRef"] = json!({"kind": "Pod", "name": pod, "namespace": s.namespace});
            }
            ep
        })
        .collect();
    json!({"metadata": metadata, "addressType": if s.ipv6 { "IPv6" } else { "IPv4" },
        "ports": ports, "endpoints": endpoints})
}

/// The version the model's agents stamp into their rows.
pub const AGENT_VERSION: &str = "0.0.0-properties";

/// The plan's input: the model's objects after `settle` rounds of status writes. In a round every
/// agent plans from the same objects, then their writes reach the API server one node after the
/// other, in an order drawn from `write_order`.
pub fn snapshot(m: &Model) -> Snapshot {
    let mut snap = base_snapshot(m);
    let mut rng = Rng(m.write_order);
    for _ in 0..m.settle {
        let mut plans: Vec<Plan> = m.nodes.iter().map(|n| plan_of(m, &snap, n.name)).collect();
        rng.shuffle(&mut plans);
        for p in &plans {
            write_status(&mut snap, p);
        }
    }
    snap
}

/// Writes one node's status as its agent does (`agent/daemon/src/agent/status.rs`): each PortMap
/// status it owns replaced whole unless the stored one says the same, and its part of each class
/// merged into the class status as stored now, which is what the agent's compare-and-swap loop
/// converges to: the merge re-run on the freshest object.
pub fn write_status(snap: &mut Snapshot, p: &Plan) {
    for w in &p.writes.portmaps {
        let stored = snap.portmaps.iter_mut().find(|pm| {
            pm.metadata.namespace.as_deref() == Some(w.namespace.as_str())
                && pm.metadata.name.as_deref() == Some(w.name.as_str())
        });
        if let Some(pm) = stored {
            let same = pm
                .status
                .as_ref()
                .is_some_and(|s| portmap_status_equivalent(s, &w.status));
            if !same {
                pm.status = Some(w.status.clone());
            }
        }
    }
    let node_rows = NodeRows::new(&snap.portmap_nodes);
    for (name, part) in class_parts(&p.writes, &p.node, &snap.classes) {
        let stored = snap
            .classes
            .iter_mut()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()));
        if let Some(class) = stored {
            let before = class.status.clone().unwrap_or_default();
            let home = RowHome::Class {
                agent_version: AGENT_VERSION,
            };
            let merged = merge_class_status(class, &node_rows, &p.node, home, &part, now());
            if merged.status != before {
                class.status = Some(merged.status);
            }
        }
    }
}

pub fn base_snapshot(m: &Model) -> Snapshot {
    Snapshot {
        classes: m
            .classes
            .iter()
            .map(|c| serde_json::from_value(class_json(c)).expect("class deserialises"))
            .collect(),
        portmaps: m
            .portmaps
            .iter()
            .map(|p| serde_json::from_value(portmap_json(p)).expect("portmap deserialises"))
            .collect(),
        endpoint_slices: m
            .slices
            .iter()
            .cloned()
            .chain(m.portmaps.iter().flat_map(pod_slices))
            .enumerate()
            .map(|(i, s)| serde_json::from_value(slice_json(&s, i)).expect("slice deserialises"))
            .collect(),
        nodes: m
            .nodes
            .iter()
            .map(|n| serde_json::from_value(node_json(n)).expect("node deserialises"))
            .collect(),
        namespaces: m
            .namespaces
            .iter()
            .map(|ns| {
                let labels = ns.tier.map_or_else(|| json!({}), |t| json!({"tier": t}));
                serde_json::from_value(json!({"metadata": {"name": ns.name, "labels": labels}}))
                    .expect("namespace deserialises")
            })
            .collect(),
        cni: m.cni.map(|port| CniFacts {
            name: "cilium".to_owned(),
            routing_mode: Some("tunnel".to_owned()),
            vxlan_port: port,
            pod_cidrs: Vec::new(),
            host_legacy_routing: None,
            bpf_masquerade: None,
        }),
        portmap_nodes: Vec::new(),
        services: Vec::new(),
        // The model's oracles do not judge Services: every PortMap's counts as present.
        services_listed: false,
        pods: Vec::new(),
        pods_listed: false,
    }
}

pub fn host_facts(m: &Model, node: &str) -> HostFacts {
    let Some(f) = NODES_AND_GHOST
        .iter()
        .position(|n| *n == node)
        .and_then(|i| m.facts.get(i))
    else {
        return HostFacts::default();
    };
    HostFacts {
        interfaces: f
            .interfaces
            .iter()
            .map(|(i, a)| {
                (
                    (*i).to_owned(),
                    format!("192.0.2.{a}").parse().expect("ipv4"),
                )
            })
            .collect(),
        interfaces6: f
            .interfaces6
            .iter()
            .map(|(i, a)| {
                (
                    (*i).to_owned(),
                    format!("2001:db8::{a:x}").parse().expect("ipv6"),
                )
            })
            .collect(),
        underlay_device: f.device.map(str::to_owned),
        underlay_mtu: f.mtu,
        ..HostFacts::default()
    }
}

/// Every node of the cluster plus one that has no Node object.
pub fn plan_nodes(m: &Model) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = m.nodes.iter().map(|n| n.name).collect();
    names.push(GHOST);
    names
}

pub fn plan_of(m: &Model, snap: &Snapshot, node: &str) -> Plan {
    plan(snap, node, &host_facts(m, node), now())
}

// ---------------------------------------------------------------------------------------------
// Shuffling every input list.

/// splitmix64: a tiny deterministic generator for permutations.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Shuffles every list of the snapshot whose order carries no meaning: the object lists, the
/// class status lists (rows, claims, conditions), the Node conditions, the slices' endpoints and
/// ports, and the set-like spec lists that no message quotes (reserved ports, selector
/// requirements and their values). With `interfaces`, also the interface lists of class nodes and
/// PortMaps, which some messages quote as written. Lists whose order the API defines (a Node's
/// addresses, an endpoint's addresses: the first one counts) are left alone.
pub fn shuffled(snap: &Snapshot, seed: u64, interfaces: bool) -> Snapshot {
    let mut rng = Rng(seed);
    let mut s = snap.clone();
    rng.shuffle(&mut s.classes);
    rng.shuffle(&mut s.portmaps);
    rng.shuffle(&mut s.endpoint_slices);
    rng.shuffle(&mut s.nodes);
    rng.shuffle(&mut s.namespaces);
    for c in &mut s.classes {
        shuffle_class(c, &mut rng, interfaces);
    }
    if interfaces {
        for p in &mut s.portmaps {
            rng.shuffle(&mut p.spec.interfaces);
        }
    }
    for slice in &mut s.endpoint_slices {
        if let Some(ports) = &mut slice.ports {
            rng.shuffle(ports);
        }
        if let Some(endpoints) = &mut slice.endpoints {
            rng.shuffle(endpoints);
        }
    }
    for node in &mut s.nodes {
        if let Some(conds) = node.status.as_mut().and_then(|st| st.conditions.as_mut()) {
            rng.shuffle(conds);
        }
    }
    s
}

pub fn shuffle_class(c: &mut PortMapClass, rng: &mut Rng, interfaces: bool) {
    rng.shuffle(&mut c.spec.ports.reserved);
    if interfaces {
        for node in c.spec.nodes.values_mut() {
            rng.shuffle(&mut node.interfaces);
        }
    }
    if let Some(exprs) = c
        .spec
        .namespace_selector
        .as_mut()
        .and_then(|s| s.match_expressions.as_mut())
    {
        rng.shuffle(exprs);
        for e in exprs {
            if let Some(values) = &mut e.values {
                rng.shuffle(values);
            }
        }
    }
    if let Some(status) = &mut c.status {
        rng.shuffle(&mut status.nodes);
        rng.shuffle(&mut status.links);
        rng.shuffle(&mut status.conditions);
    }
}

/// The plan with every human-readable message blanked (condition messages and row messages).
pub fn without_messages(mut p: Plan) -> Plan {
    for d in &mut p.portmaps {
        d.accepted.message.clear();
        if let Some(pr) = &mut d.programmed {
            pr.message.clear();
        }
    }
    for c in &mut p.classes {
        c.ready.message.clear();
    }
    for w in &mut p.writes.portmaps {
        for cond in &mut w.status.conditions {
            cond.message.clear();
        }
    }
    for w in &mut p.writes.class_rows {
        w.row.message = None;
        w.ready.message.clear();
    }
    p
}
