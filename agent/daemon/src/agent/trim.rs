//! What the watches keep of each object: only what a pass reads.
//!
//! The stores hold every watched object for as long as the agent runs, and a pass copies the
//! ones that changed. Most of an object is never read: `managedFields`, annotations (a
//! `kubectl apply` leaves the whole object again in `last-applied-configuration`, up to 256 KiB
//! per object), labels nothing selects on, a Node's image list and capacity. Anyone who may
//! create a PortMap or a Service decides how large those are, and every agent on every node
//! held them: 1,000 PortMaps carrying a 100 KiB annotation each are 100 MiB of annotations
//! alone, against the DaemonSet's 128 MiB memory limit. Each kind is trimmed as its events
//! arrive, before the
//! store takes it, to the fields `relevance.rs` says a pass reads (plus the metadata the stores
//! and the snapshot key on: name, namespace, uid, `resourceVersion`, generation, creation and
//! deletion times). A test plans a cluster before and after trimming and gets the same plans.

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, Namespace, Node, NodeSpec, NodeStatus, ObjectReference,
    Pod, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kuport_core::api::{
    PREFLIGHT_ANNOTATION, PREFLIGHT_DEADLINE_ANNOTATION, PortMap, PortMapClass, PortMapNode,
    RELEASE_HELD_PORTS_ANNOTATION, conditions,
};
use kuport_core::snapshot::{CILIUM_CONFIG_KEYS, CILIUM_HOST_ANNOTATIONS, SERVICE_NAME_LABEL};

/// A watched kind, trimmed to what a pass reads before its store keeps it.
pub(crate) trait Trim {
    fn trim(&mut self);
}

/// The metadata no pass reads: managed fields, annotations, owners and finalizers, and the
/// labels (unless `keep_labels` says which to keep).
fn trim_meta(meta: &mut ObjectMeta, keep_label: impl Fn(&str) -> bool) {
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.generate_name = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| keep_label(k));
        if labels.is_empty() {
            meta.labels = None;
        }
    }
}

/// Keeps only the annotations `keep` names (after [`trim_meta`] dropped them all, so called
/// with the object's original annotations).
fn keep_annotations(
    meta: &mut ObjectMeta,
    annotations: Option<std::collections::BTreeMap<String, String>>,
    keep: &[&str],
) {
    let kept: std::collections::BTreeMap<String, String> = annotations
        .into_iter()
        .flatten()
        .filter(|(k, _)| keep.contains(&k.as_str()))
        .collect();
    meta.annotations = (!kept.is_empty()).then_some(kept);
}

impl Trim for PortMapClass {
    /// A class keeps the three annotations the plan reads: the administrator's release of
    /// held-port claims, the mark of a preflight class (which needs every pair's link) and its
    /// deadline (after which it needs none).
    fn trim(&mut self) {
        let annotations = self.metadata.annotations.take();
        trim_meta(&mut self.metadata, |_| false);
        keep_annotations(
            &mut self.metadata,
            annotations,
            &[
                RELEASE_HELD_PORTS_ANNOTATION,
                PREFLIGHT_ANNOTATION,
                PREFLIGHT_DEADLINE_ANNOTATION,
            ],
        );
    }
}

impl Trim for PortMap {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata, |_| false);
    }
}

impl Trim for PortMapNode {
    fn trim(&mut self) {
        trim_meta(&mut self.metadata, |_| false);
    }
}

impl Trim for EndpointSlice {
    /// A slice keeps the label naming its Service, its address type, each port's name,
    /// protocol and number, and of each endpoint what `plan/endpoint.rs` reads: its first
    /// address, whether it is ready, its node and its pod's name. The rest (up to 99 more
    /// addresses per endpoint, hostnames, zones, hints, topology) goes. The slice watch decodes
    /// slices to the same fields without allocating the rest (`slice_decode.rs`).
    fn trim(&mut self) {
        self.metadata = ObjectMeta {
            name: self.metadata.name.take(),
            namespace: self.metadata.namespace.take(),
            uid: self.metadata.uid.take(),
            resource_version: self.metadata.resource_version.take(),
            generation: self.metadata.generation,
            creation_timestamp: self.metadata.creation_timestamp.take(),
            deletion_timestamp: self.metadata.deletion_timestamp.take(),
            labels: self.metadata.labels.take(),
            ..ObjectMeta::default()
        };
        trim_meta(&mut self.metadata, |k| k == SERVICE_NAME_LABEL);
        for ep in self.endpoints.iter_mut().flatten() {
            *ep = Endpoint {
                addresses: std::mem::take(&mut ep.addresses)
                    .into_iter()
                    .take(1)
                    .collect(),
                conditions: ep.conditions.take().map(|c| EndpointConditions {
                    ready: c.ready,
                    ..EndpointConditions::default()
                }),
                node_name: ep.node_name.take(),
                target_ref: ep.target_ref.take().map(|t| ObjectReference {
                    name: t.name,
                    ..ObjectReference::default()
                }),
                ..Endpoint::default()
            };
        }
        for port in self.ports.iter_mut().flatten() {
            port.app_protocol = None;
        }
    }
}

impl Trim for Node {
    /// A Node keeps its Ready condition and its addresses (`node_is_ready`,
    /// `node_internal_ip`, and no endpoint may be one), its pod CIDRs and Cilium's
    /// `cilium_host` annotation (endpoints must be pod addresses, never the CNI's gateway); the
    /// rest of its spec, images, capacity and system info go.
    fn trim(&mut self) {
        let annotations = self.metadata.annotations.take();
        trim_meta(&mut self.metadata, |_| false);
        keep_annotations(&mut self.metadata, annotations, &CILIUM_HOST_ANNOTATIONS);
        self.spec = self.spec.take().map(|s| NodeSpec {
            pod_cidr: s.pod_cidr,
            pod_cidrs: s.pod_cidrs,
            ..NodeSpec::default()
        });
        self.status = self.status.take().map(|s| NodeStatus {
            addresses: s.addresses,
            conditions: s.conditions.map(|mut c| {
                c.retain(|c| c.type_ == conditions::READY);
                for c in &mut c {
                    c.message = None;
                    c.reason = None;
                }
                c
            }),
            ..NodeStatus::default()
        });
    }
}

impl Trim for Service {
    /// Only the NodePorts are read: the type, each port's protocol, number and `nodePort`, and
    /// the health-check NodePort. A cluster may hold thousands of Services.
    fn trim(&mut self) {
        trim_meta(&mut self.metadata, |_| false);
        self.status = None;
        let Some(spec) = self.spec.take() else {
            return;
        };
        let ports = spec.ports.map(|ports| {
            ports
                .into_iter()
                .map(|p| ServicePort {
                    protocol: p.protocol,
                    port: p.port,
                    node_port: p.node_port,
                    ..ServicePort::default()
                })
                .collect()
        });
        self.spec = Some(ServiceSpec {
            type_: spec.type_,
            ports,
            health_check_node_port: spec.health_check_node_port,
            ..ServiceSpec::default()
        });
    }
}

impl Trim for Pod {
    /// Only the hostPorts, the node, `hostNetwork`, the phase and the Pod's addresses are read
    /// (endpoints are delivered only to the node's own Pods): a Pod spec also holds images,
    /// commands and environment values, which the agent has no business keeping.
    fn trim(&mut self) {
        trim_meta(&mut self.metadata, |_| false);
        self.status = self.status.take().map(|s| PodStatus {
            phase: s.phase,
            pod_ip: s.pod_ip,
            pod_ips: s.pod_ips,
            ..PodStatus::default()
        });
        let Some(spec) = self.spec.take() else {
            return;
        };
        let host_ports = |containers: Vec<Container>| -> Vec<Container> {
            containers
                .into_iter()
                .filter_map(|c| {
                    let ports: Vec<ContainerPort> = c
                        .ports
                        .into_iter()
                        .flatten()
                        .filter(|p| p.host_port.is_some_and(|h| h != 0))
                        .collect();
                    (!ports.is_empty()).then(|| Container {
                        name: c.name,
                        ports: Some(ports),
                        ..Container::default()
                    })
                })
                .collect()
        };
        self.spec = Some(PodSpec {
            node_name: spec.node_name,
            host_network: spec.host_network,
            containers: host_ports(spec.containers),
            init_containers: spec
                .init_containers
                .map(host_ports)
                .filter(|c| !c.is_empty()),
            ..PodSpec::default()
        });
    }
}

impl Trim for Namespace {
    /// A Namespace keeps its labels (class namespace selectors read them).
    fn trim(&mut self) {
        trim_meta(&mut self.metadata, |_| true);
        self.spec = None;
        self.status = None;
    }
}

impl Trim for ConfigMap {
    /// `cilium-config` keeps the keys `CniFacts::from_cilium_config` reads.
    fn trim(&mut self) {
        trim_meta(&mut self.metadata, |_| false);
        self.binary_data = None;
        if let Some(data) = self.data.as_mut() {
            data.retain(|k, _| CILIUM_CONFIG_KEYS.contains(&k.as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use kuport_core::plan::plan;
    use kuport_core::snapshot::{CniFacts, Snapshot};
    use kuport_testkit::cluster::{Cluster, facts, now, pm, vxlan_spec};
    use serde_json::{Value, json};

    use super::*;

    /// A cluster of every kind, each object carrying what real objects carry besides: a
    /// last-applied annotation, managed fields, owners, finalizers, labels, a Node's images.
    fn cluster() -> Cluster {
        let mut c = Cluster::new()
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
            .claim("public", "edge-a/worker-b", 0)
            .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
            .portmap(pm("games", "gs", "public", 3000))
            .endpoint("games", "gw", "gw-0", "worker-b", "10.244.1.77", 3001)
            .portmap(pm("games", "gw", "public", 3001))
            .node_port_service("shop", "web", "TCP", 31000)
            .portmap(pm("games", "np", "public", 31000).tcp())
            .host_port_pod("ingress", "nginx-0", "edge-a", "TCP", 8443, None)
            .portmap(pm("games", "hp", "public", 8443).tcp())
            .without_system_reserved("public")
            .cni_port(8472);
        let heavy = |meta: &mut ObjectMeta| {
            let big = "x".repeat(100 * 1024);
            meta.annotations = Some(
                [(
                    "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                    big,
                )]
                .into(),
            );
            meta.labels
                .get_or_insert_default()
                .insert("app.kubernetes.io/part-of".into(), "games".into());
            meta.finalizers = Some(vec!["example.com/keep".into()]);
            meta.managed_fields = Some(vec![Default::default()]);
        };
        let s = &mut c.snapshot;
        s.classes.iter_mut().for_each(|o| heavy(&mut o.metadata));
        s.services.iter_mut().for_each(|o| heavy(&mut o.metadata));
        s.pods.iter_mut().for_each(|o| heavy(&mut o.metadata));
        for pod in &mut s.pods {
            let spec = pod.spec.get_or_insert_default();
            spec.containers[0].image = Some("registry.example.com/big/image:1".into());
            spec.containers[0].env = Some(vec![
                serde_json::from_value(json!({"name": "TOKEN", "value": "x".repeat(10_000)}))
                    .expect("an env var"),
            ]);
        }
        // What the plan reads of annotations: a class's release of held-port claims (a claim
        // on 3005 whose holder left before it, which edge-a's row would otherwise keep), and
        // Cilium's cilium_host address of a Node (gw's endpoint).
        let class = &mut s.classes[0];
        class.metadata.annotations.get_or_insert_default().insert(
            RELEASE_HELD_PORTS_ANNOTATION.into(),
            "2026-05-01T00:00:00Z".into(),
        );
        let row = class
            .status
            .iter_mut()
            .flat_map(|st| st.nodes.iter_mut())
            .find(|r| r.name == "edge-a")
            .expect("edge-a's row");
        row.held_ports.push(
            serde_json::from_value(json!({"protocol": "UDP", "port": 3005,
                "address": "0.0.0.0", "holder": "host UDP socket 0.0.0.0:3005",
                "absentSince": "2026-04-01T00:00:00Z"}))
            .expect("a held port"),
        );
        // And a preflight class, whose mark makes every pair of its nodes need a link, and whose
        // deadline (past) makes it need none.
        let mut preflight = s.classes[0].clone();
        preflight.metadata.name = Some("kuport-preflight".into());
        preflight.status = None;
        preflight.spec.return_path = serde_json::from_value(json!({"mode": "Vxlan",
            "vxlan": {"subnet": "169.254.112.0/20", "vni": 60000, "port": 4790}}))
        .expect("a return path");
        preflight
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(PREFLIGHT_ANNOTATION.into(), "true".into());
        preflight
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(
                PREFLIGHT_DEADLINE_ANNOTATION.into(),
                "2026-05-01T00:00:00Z".into(),
            );
        s.classes.push(preflight);
        s.portmaps.iter_mut().for_each(|o| heavy(&mut o.metadata));
        s.endpoint_slices
            .iter_mut()
            .for_each(|o| heavy(&mut o.metadata));
        s.namespaces.iter_mut().for_each(|o| heavy(&mut o.metadata));
        for node in &mut s.nodes {
            heavy(&mut node.metadata);
            let status = node.status.get_or_insert_default();
            status.images =
                Some(vec![serde_json::from_value(json!({
                "names": ["registry.example.com/big/image:1"], "sizeBytes": 1_000_000_000_i64
            }))
            .expect("an image")]);
            status.conditions.get_or_insert_default().push(
                serde_json::from_value(json!({"type": "MemoryPressure", "status": "False"}))
                    .expect("a condition"),
            );
            node.spec.get_or_insert_default().provider_id = Some("cloud://x".repeat(100));
        }
        let worker = s
            .nodes
            .iter_mut()
            .find(|n| n.metadata.name.as_deref() == Some("worker-b"))
            .expect("worker-b");
        worker
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(CILIUM_HOST_ANNOTATIONS[0].into(), "10.244.1.77".into());
        c
    }

    fn trimmed(s: &Snapshot) -> Snapshot {
        let mut s = s.clone();
        s.classes.iter_mut().for_each(Trim::trim);
        s.portmaps.iter_mut().for_each(Trim::trim);
        s.endpoint_slices.iter_mut().for_each(Trim::trim);
        s.nodes.iter_mut().for_each(Trim::trim);
        s.namespaces.iter_mut().for_each(Trim::trim);
        s.services.iter_mut().for_each(Trim::trim);
        s.pods.iter_mut().for_each(Trim::trim);
        s
    }

    #[test]
    fn trimming_changes_no_plan_and_drops_the_weight() {
        let c = cluster();
        let before = c.snapshot.clone();
        let after = trimmed(&before);
        for node in ["edge-a", "edge-c", "worker-b"] {
            let f = match node {
                "edge-a" => facts(&[("wt0", "100.64.0.1")], "wt0", 1400),
                "edge-c" => facts(&[("wt0", "100.64.0.3")], "wt0", 1400),
                _ => facts(&[], "wt0", 1400),
            };
            assert_eq!(
                plan(&before, node, &f, now()),
                plan(&after, node, &f, now()),
                "trimming changed {node}'s plan"
            );
        }
        let size = |s: &Snapshot| {
            serde_json::to_string(&(
                &s.classes,
                &s.portmaps,
                &s.endpoint_slices,
                &s.nodes,
                &s.namespaces,
                &s.services,
                &s.pods,
            ))
            .expect("json")
            .len()
        };
        // Thirteen objects, each with its 100 KiB annotation.
        assert!(size(&before) > 13 * 100 * 1024, "{}", size(&before));
        assert!(size(&after) < 20_000, "{} bytes left", size(&after));
        // The annotations kept are read: without them edge-a's plan differs (its row would keep
        // the released claim, and gw's endpoint at cilium_host would be used).
        let mut bare = after.clone();
        bare.classes
            .iter_mut()
            .for_each(|c| c.metadata.annotations = None);
        let f = facts(&[("wt0", "100.64.0.1")], "wt0", 1400);
        assert_ne!(
            plan(&bare, "edge-a", &f, now()),
            plan(&after, "edge-a", &f, now()),
            "the release annotation is read"
        );
        let mut undated = after.clone();
        for c in &mut undated.classes {
            if let Some(a) = c.metadata.annotations.as_mut() {
                a.remove(PREFLIGHT_DEADLINE_ANNOTATION);
            }
        }
        assert_ne!(
            plan(&undated, "edge-a", &f, now()),
            plan(&after, "edge-a", &f, now()),
            "the preflight deadline is read"
        );
        let mut bare = after.clone();
        bare.nodes
            .iter_mut()
            .for_each(|n| n.metadata.annotations = None);
        assert_ne!(
            plan(&bare, "edge-a", &f, now()),
            plan(&after, "edge-a", &f, now()),
            "the cilium_host annotation is read"
        );
        // And so are the pod CIDRs.
        let mut bare = after.clone();
        bare.nodes.iter_mut().for_each(|n| n.spec = None);
        assert_ne!(
            plan(&bare, "edge-a", &f, now()),
            plan(&after, "edge-a", &f, now()),
            "the pod CIDRs are read"
        );
        // The NodePort and the hostPort are held on edge-a after trimming.
        let held: Vec<String> = plan(&after, "edge-a", &f, now())
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
            ]
        );
        // What the stores key on stays.
        let pm = &after.portmaps[0].metadata;
        assert!(pm.name.is_some() && pm.namespace.is_some() && pm.creation_timestamp.is_some());
        // A slice keeps the label naming its Service, a Namespace its labels.
        let slice = after.endpoint_slices[0].metadata.labels.as_ref();
        assert_eq!(
            slice.map(|l| l.keys().cloned().collect::<Vec<_>>()),
            Some(vec![SERVICE_NAME_LABEL.to_owned()])
        );
        assert!(
            after.namespaces[0]
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("team"))
        );
    }

    #[test]
    fn cilium_config_keeps_what_the_facts_read() {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "cilium-config", "namespace": "kube-system",
                         "annotations": {"a": "x".repeat(10_000)}},
            "data": {"routing-mode": "tunnel", "tunnel-port": "8473", "tunnel": "vxlan",
                     "enable-bpf-masquerade": "true", "enable-ipv6": "false",
                     "cluster-name": "default"},
        }))
        .expect("a ConfigMap");
        let mut small = cm.clone();
        small.trim();
        assert_eq!(
            CniFacts::from_cilium_config(&small),
            CniFacts::from_cilium_config(&cm)
        );
        // Read: routing-mode, tunnel-port, tunnel and enable-bpf-masquerade (host routing).
        assert_eq!(small.data.as_ref().map(|d| d.len()), Some(4));
        assert!(small.metadata.annotations.is_none());
    }
}
