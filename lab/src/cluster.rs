//! The lab's side of the API server: it applies the scenario's objects and plays kubelet (Nodes)
//! and the EndpointSlice controller (Services and slices following the pods).
//!
//! Against the real control plane (`--apiserver real`) it plays kubelet only: it writes Pods
//! (bound to their node, then their status with both pod IPs and readiness) and renews each
//! node's Lease; the real EndpointSlice controller writes the slices, and the real
//! node-lifecycle controller marks a node whose Lease stops being renewed not ready.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::{Client, Config};
use kuport_testkit::objects;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::scenario::IpFamily;
use crate::topology::{NodeIps, PodInfo};

/// How often the lab renews each live node's Lease (kubelet's default is 10 s; the real
/// controller-manager runs with a 10 s grace period, see kuport-realapi).
const LEASE_RENEWAL: Duration = Duration::from_secs(1);

/// The namespace of the DaemonSet a `daemonSet: true` scenario records.
pub const DAEMON_SET_NAMESPACE: &str = objects::DAEMONSET_NAMESPACE;

/// The kinds the lab writes: (kind, group, version, plural, namespaced).
const KINDS: &[(&str, &str, &str, &str, bool)] = &[
    ("Namespace", "", "v1", "namespaces", false),
    ("Node", "", "v1", "nodes", false),
    ("Service", "", "v1", "services", true),
    ("ConfigMap", "", "v1", "configmaps", true),
    ("ServiceAccount", "", "v1", "serviceaccounts", true),
    ("Pod", "", "v1", "pods", true),
    ("DaemonSet", "apps", "v1", "daemonsets", true),
    (
        "EndpointSlice",
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        true,
    ),
    (
        "PortMapClass",
        "kuport.wlz.li",
        "v1alpha1",
        "portmapclasses",
        false,
    ),
    ("PortMap", "kuport.wlz.li", "v1alpha1", "portmaps", true),
];

pub struct Cluster {
    client: Client,
    /// Against the real control plane: its controllers write slices and node readiness.
    real: bool,
    /// Nodes whose Lease is renewed (real control plane only).
    alive: Arc<Mutex<BTreeSet<String>>>,
    heartbeat: Option<JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(task) = &self.heartbeat {
            task.abort();
        }
    }
}

fn resource(kind: &str) -> Result<(ApiResource, bool)> {
    let (k, group, version, plural, namespaced) = KINDS
        .iter()
        .find(|(k, ..)| *k == kind)
        .with_context(|| format!("the lab cannot write kind {kind}"))?;
    let api_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok((
        ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version,
            kind: k.to_string(),
            plural: plural.to_string(),
        },
        *namespaced,
    ))
}

impl Cluster {
    /// A client of the API server `kubeconfig` names; `real` when it is the real control plane.
    pub async fn connect(kubeconfig: &Path, real: bool) -> Result<Self> {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("reading {}", kubeconfig.display()))?;
        let config = Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .context("loading the lab kubeconfig")?;
        let client = Client::try_from(config).context("building the API client")?;
        let alive = Arc::new(Mutex::new(BTreeSet::new()));
        let heartbeat = real.then(|| tokio::spawn(renew_leases(client.clone(), alive.clone())));
        Ok(Self {
            client,
            real,
            alive,
            heartbeat,
        })
    }

    /// Whether the lab's own Lease renewals keep `node` alive.
    fn set_alive(&self, node: &str, alive: bool) {
        let mut set = self
            .alive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if alive {
            set.insert(node.to_owned());
        } else {
            set.remove(node);
        }
    }

    fn api(&self, kind: &str, namespace: Option<&str>) -> Result<Api<DynamicObject>> {
        let (ar, namespaced) = resource(kind)?;
        Ok(match (namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            (true, None) => bail!("{kind} is namespaced: give a namespace"),
            (false, _) => Api::all_with(self.client.clone(), &ar),
        })
    }

    /// Applies every document of a YAML stream in order: created when new, else its spec (and
    /// everything but status) replaced.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<Vec<String>> {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(yaml).context("parsing the objects as YAML")?;
        let mut applied = Vec::new();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            applied.push(self.apply(doc).await?);
        }
        Ok(applied)
    }

    pub async fn apply(&self, doc: Value) -> Result<String> {
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .context("an object without kind")?
            .to_string();
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .with_context(|| format!("a {kind} without metadata.name"))?
            .to_string();
        let namespace = doc
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string);
        let (_, namespaced) = resource(&kind)?;
        let ns = if namespaced {
            Some(namespace.unwrap_or_else(|| "default".into()))
        } else {
            None
        };
        let api = self.api(&kind, ns.as_deref())?;
        let mut obj: DynamicObject = serde_json::from_value(doc.clone())
            .with_context(|| format!("{kind} {name}: not an object"))?;
        let what = match &ns {
            Some(ns) => format!("{kind} {ns}/{name}"),
            None => format!("{kind} {name}"),
        };
        match api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading {what}"))?
        {
            None => {
                api.create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("creating {what}"))?;
            }
            Some(existing) => {
                obj.metadata.resource_version = existing.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("replacing {what}"))?;
            }
        }
        Ok(what)
    }

    pub async fn delete(&self, kind: &str, namespace: Option<&str>, name: &str) -> Result<()> {
        let api = self.api(kind, namespace)?;
        api.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting {kind} {name}"))?;
        Ok(())
    }

    pub async fn get(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>> {
        let api = self.api(kind, namespace)?;
        let obj = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading {kind} {name}"))?;
        obj.map(|o| serde_json::to_value(o).context("encoding"))
            .transpose()
    }

    /// Registers a Node the way kubelet does: InternalIP is the mesh address (and its IPv6 one
    /// second, on an IPv6 mesh, as `--node-ip` of both families lists them), Ready as given
    /// (against the real control plane, its Lease renewed from now on), with the pod CIDR its
    /// pods' addresses come from (what the node IPAM controller would have assigned).
    pub async fn register_node(
        &self,
        name: &str,
        internal_ips: NodeIps,
        pod_cidrs: &[&str],
        ready: bool,
    ) -> Result<()> {
        let first = pod_cidrs.first().context("a Node needs a pod CIDR")?;
        self.apply(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"podCIDR": first, "podCIDRs": pod_cidrs},
            "status": node_status(internal_ips, ready, self.real),
        }))
        .await?;
        self.set_node_ready(name, internal_ips, ready).await
    }

    /// The node controller's part: flips the Node's Ready condition through the status
    /// subresource. Against the real control plane, a node going not ready only stops having
    /// its Lease renewed (the real node-lifecycle controller notices within its grace period);
    /// one coming back is renewed again and reports Ready, as a restarted kubelet does.
    pub async fn set_node_ready(
        &self,
        name: &str,
        internal_ips: NodeIps,
        ready: bool,
    ) -> Result<()> {
        if self.real {
            self.set_alive(name, ready);
            if !ready {
                return Ok(());
            }
        }
        let status = json!({"status": node_status(internal_ips, ready, self.real)});
        self.merge_status("Node", None, name, &status)
            .await
            .with_context(|| format!("setting Node {name} Ready={ready}"))
    }

    /// A merge patch of an object's status subresource.
    pub async fn merge_status(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        status: &Value,
    ) -> Result<()> {
        self.api(kind, namespace)?
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(status),
            )
            .await?;
        Ok(())
    }

    /// The DaemonSet `kuport-system/kuport-agent` and one Pod of it per node (named
    /// `kuport-agent-<node>`, owned by it), as the DaemonSet controller would make them, with
    /// the labels `deploy/manifests` gives them (`kuport status` finds the agents by them).
    /// Their status is written by [`crate::agentpods`], in step with the agent processes.
    pub async fn install_daemon_set(&self, nodes: &[String]) -> Result<()> {
        // Labelled as deploy/manifests labels it: `kuport preflight` checks the label.
        self.apply(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": DAEMON_SET_NAMESPACE,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
        )
        .await?;
        self.apply(agent_daemon_set()).await?;
        let ds = self
            .get(
                "DaemonSet",
                Some(DAEMON_SET_NAMESPACE),
                objects::AGENT_DAEMONSET,
            )
            .await?
            .context("the DaemonSet just created is missing")?;
        let uid = ds
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .context("the DaemonSet has no uid")?
            .to_owned();
        for node in nodes {
            self.apply(agent_pod(node, &uid)).await?;
        }
        Ok(())
    }

    pub async fn ensure_namespace(&self, name: &str) -> Result<()> {
        if self.get("Namespace", None, name).await?.is_none() {
            self.apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            )
            .await?;
        }
        Ok(())
    }

    /// The Service (created when the scenario's objects did not) and its EndpointSlice of each
    /// of its `families`, listing `pods` with their readiness and node; against the real control
    /// plane, the Service (with its `families`) and the pods' Pod objects (with an address of
    /// each family), from which the real controller writes the slice of each family.
    pub async fn sync_service(
        &self,
        namespace: &str,
        service: &str,
        pods: &[&PodInfo],
        families: &[IpFamily],
    ) -> Result<()> {
        self.ensure_service(namespace, service, pods, families)
            .await?;
        // Each node delivers only to Pods bound to it: their objects come first, against the
        // model as against the real control plane (whose controller writes the slices).
        for pod in pods {
            self.sync_pod(namespace, service, pod).await?;
        }
        if self.real {
            return Ok(());
        }
        for family in families {
            self.write_slice(namespace, service, pods, *family).await?;
        }
        Ok(())
    }

    /// Kubelet's part for one pod: its Pod object bound to its node (created again when it
    /// moved: `nodeName` cannot change), then its status: running, its IP, its readiness.
    /// `service` is its `app` label (its Service's selector).
    pub async fn sync_pod(&self, namespace: &str, service: &str, pod: &PodInfo) -> Result<()> {
        let name = &pod.spec.name;
        let what = format!("Pod {namespace}/{name}");
        // The ServiceAccount admission refuses pods whose account does not exist, and no
        // controller creates `default` here (the model has neither).
        if self.real
            && self
                .get("ServiceAccount", Some(namespace), "default")
                .await?
                .is_none()
        {
            self.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": namespace}}))
                .await?;
        }
        let api = self.api("Pod", Some(namespace))?;
        let existing = self.get("Pod", Some(namespace), name).await?;
        let bound_to = existing
            .as_ref()
            .and_then(|p| p.pointer("/spec/nodeName").and_then(Value::as_str))
            .map(str::to_owned);
        if existing.is_some() && bound_to.as_deref() != Some(pod.node.as_str()) {
            api.delete(name, &DeleteParams::default().grace_period(0))
                .await
                .with_context(|| format!("deleting {what} to move it"))?;
            for _ in 0..100 {
                if self.get("Pod", Some(namespace), name).await?.is_none() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if bound_to.as_deref() != Some(pod.node.as_str()) {
            let container = json!({"name": "echo", "image": "kuport-lab/echo"});
            let mut obj = objects::bound_pod(name, service, &pod.node, container);
            obj["metadata"]["namespace"] = json!(namespace);
            let obj: DynamicObject = serde_json::from_value(obj).context("a Pod object")?;
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating {what}"))?;
        }
        let status = pod_status(pod, &Timestamp::now().to_string());
        self.merge_status("Pod", Some(namespace), name, &status)
            .await
            .with_context(|| format!("writing the status of {what}"))
    }

    async fn ensure_service(
        &self,
        namespace: &str,
        service: &str,
        pods: &[&PodInfo],
        families: &[IpFamily],
    ) -> Result<()> {
        let ports = service_ports(pods);
        if self
            .get("Service", Some(namespace), service)
            .await?
            .is_none()
        {
            let svc_ports: Vec<Value> = ports
                .iter()
                .map(|p| json!({"name": p["name"], "protocol": p["protocol"], "port": p["port"], "targetPort": p["port"]}))
                .collect();
            let mut svc = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": service, "namespace": namespace},
                "spec": {"ports": svc_ports, "selector": {"app": service}},
            });
            // A Service of the default family is written as before; any other says its families
            // as the API server would have completed them.
            if families != [IpFamily::IPv4] {
                let policy = match families.len() {
                    1 => "SingleStack",
                    _ => "RequireDualStack",
                };
                svc["spec"]["ipFamilies"] =
                    json!(families.iter().map(|f| f.as_str()).collect::<Vec<_>>());
                svc["spec"]["ipFamilyPolicy"] = json!(policy);
            }
            self.apply(svc).await?;
        }
        Ok(())
    }

    /// The slice of `family` (`<service>-lab` for IPv4, `<service>-lab-v6` for IPv6) listing
    /// the pods of that family, each at its address of that family.
    async fn write_slice(
        &self,
        namespace: &str,
        service: &str,
        pods: &[&PodInfo],
        family: IpFamily,
    ) -> Result<()> {
        let pods: Vec<&PodInfo> = pods
            .iter()
            .copied()
            .filter(|p| p.spec.has_family(family))
            .collect();
        let (name, v6) = match family {
            IpFamily::IPv4 => (format!("{service}-lab"), false),
            IpFamily::IPv6 => (format!("{service}-lab-v6"), true),
        };
        let mut slice = objects::slice(namespace, &name, service)
            .label("endpointslice.kubernetes.io/managed-by", "kuport-lab")
            .ports(service_ports(&pods));
        if v6 {
            slice = slice.ipv6();
        }
        for pod in pods {
            let address = match family {
                IpFamily::IPv4 => pod.ip.to_string(),
                IpFamily::IPv6 => pod.ip6.to_string(),
            };
            let endpoint = objects::endpoint(&address, &pod.node)
                .ready(pod.ready)
                .condition("serving", pod.ready)
                .condition("terminating", false)
                .pod(namespace, &pod.spec.name);
            slice = slice.endpoint(endpoint);
        }
        self.apply(slice.object()).await?;
        Ok(())
    }
}

/// The status a dual-stack kubelet writes for `pod` (as a merge patch): running since `now`,
/// its readiness, and both its addresses, IPv4 first (every lab pod has one of each family; the
/// EndpointSlice controller lists in each slice the address of the slice's family).
fn pod_status(pod: &PodInfo, now: &str) -> Value {
    let ready = if pod.ready { "True" } else { "False" };
    json!({"status": {
        "phase": "Running",
        "podIP": pod.ip.to_string(),
        "podIPs": [{"ip": pod.ip.to_string()}, {"ip": pod.ip6.to_string()}],
        "startTime": now,
        "conditions": [
            {"type": "Ready", "status": ready, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
        ],
    }})
}

/// The labels `deploy/manifests/daemonset.yaml` puts on the DaemonSet, its selector and its
/// Pods (a unit test compares them with the file).
const AGENT_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "kuport"),
    ("app.kubernetes.io/component", "agent"),
];

fn agent_labels() -> Value {
    Value::Object(
        AGENT_LABELS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect(),
    )
}

/// The lab's agent DaemonSet: the testkit's, labelled as the shipped one.
fn agent_daemon_set() -> Value {
    let mut ds = objects::agent_daemonset();
    ds["metadata"]["labels"] = agent_labels();
    ds["spec"]["selector"]["matchLabels"] = agent_labels();
    ds["spec"]["template"]["metadata"]["labels"] = agent_labels();
    ds
}

/// The lab's agent Pod on `node`, owned by the DaemonSet with uid `daemonset_uid`, labelled
/// as the DaemonSet's template; on the node's own network, as the shipped one.
fn agent_pod(node: &str, daemonset_uid: &str) -> Value {
    let mut pod = objects::agent_pod(node, daemonset_uid);
    pod["metadata"]["labels"] = agent_labels();
    pod["spec"]["hostNetwork"] = json!(true);
    pod
}

/// The ports of a Service over `pods`: each distinct (name, protocol, port) of theirs, in order.
fn service_ports(pods: &[&PodInfo]) -> Vec<Value> {
    let mut ports: Vec<Value> = Vec::new();
    for pod in pods {
        for p in &pod.spec.ports {
            let name = p
                .name
                .clone()
                .unwrap_or_else(|| format!("{}-{}", p.protocol.lower(), p.port));
            let entry = json!({"name": name, "protocol": p.protocol.as_str(), "port": p.port});
            if !ports.contains(&entry) {
                ports.push(entry);
            }
        }
    }
    ports
}

/// A Node's status as kubelet reports it, IPv4 InternalIP first; `now` stamps the heartbeat
/// (the real node-lifecycle controller reads it), else a fixed time keeps the model's objects
/// reproducible.
fn node_status(internal_ips: NodeIps, ready: bool, now: bool) -> Value {
    let at = if now {
        Timestamp::now().to_string()
    } else {
        "2026-01-01T00:00:00Z".to_owned()
    };
    let (v4, v6) = internal_ips;
    let ips: Vec<String> = v4
        .map(IpAddr::V4)
        .into_iter()
        .chain(v6.map(IpAddr::V6))
        .map(|ip| ip.to_string())
        .collect();
    let first = ips.first().map_or("", String::as_str);
    let mut status = objects::kubelet_node_status(first, ready, &at);
    if let Some(addresses) = status["addresses"].as_array_mut() {
        for ip in ips.iter().skip(1) {
            addresses.push(json!({"type": "InternalIP", "address": ip}));
        }
    }
    status
}

/// Kubelet's heartbeat: renews the Lease of every live node, every [`LEASE_RENEWAL`].
async fn renew_leases(client: Client, alive: Arc<Mutex<BTreeSet<String>>>) {
    let api: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    loop {
        let nodes: Vec<String> = alive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        for node in nodes {
            if let Err(e) = renew_lease(&api, &node).await {
                eprintln!("kuport-lab: renewing the Lease of node {node}: {e:#}");
            }
        }
        tokio::time::sleep(LEASE_RENEWAL).await;
    }
}

async fn renew_lease(api: &Api<Lease>, node: &str) -> Result<()> {
    let mut lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
    }))
    .context("a Lease")?;
    if let Some(spec) = lease.spec.as_mut() {
        spec.renew_time = Some(MicroTime(Timestamp::now()));
    }
    match api.get_opt(node).await? {
        None => {
            api.create(&PostParams::default(), &lease).await?;
        }
        Some(existing) => {
            lease.metadata.resource_version = existing.metadata.resource_version;
            api.replace(node, &PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

/// A condition of an object's status, as (status, reason).
pub fn condition(obj: &Value, kind: &str) -> Option<(String, String, String)> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        .map(|c| {
            let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (s("status"), s("reason"), s("message"))
        })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn a_nodes_internal_ips_are_listed_ipv4_first_and_only_those_it_has() {
        let v4 = Ipv4Addr::new(100, 64, 0, 2);
        let v6: Ipv6Addr = "fd00:100:64::2".parse().expect("an address");
        let listed = |ips: NodeIps| -> Vec<String> {
            node_status(ips, true, false)["addresses"]
                .as_array()
                .expect("addresses")
                .iter()
                .map(|a| {
                    assert_eq!(a["type"], "InternalIP");
                    a["address"].as_str().expect("an address").to_owned()
                })
                .collect()
        };
        assert_eq!(listed((Some(v4), None)), ["100.64.0.2"]);
        assert_eq!(
            listed((Some(v4), Some(v6))),
            ["100.64.0.2", "fd00:100:64::2"]
        );
        assert_eq!(listed((None, Some(v6))), ["fd00:100:64::2"]);
    }

    /// The labels of the lab's DaemonSet, its selector and its Pods are the shipped ones.
    #[test]
    fn the_agents_are_labelled_as_the_manifests_label_them() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/manifests/daemonset.yaml");
        let text = std::fs::read_to_string(&path).expect("the shipped DaemonSet");
        let shipped: Value = serde_saphyr::from_str(&text).expect("YAML");
        let ds = agent_daemon_set();
        for pointer in [
            "/metadata/labels",
            "/spec/selector/matchLabels",
            "/spec/template/metadata/labels",
        ] {
            assert_eq!(ds.pointer(pointer), shipped.pointer(pointer), "{pointer}");
        }
        let pod = agent_pod("worker-b", "uid-1");
        assert_eq!(
            pod.pointer("/metadata/labels"),
            shipped.pointer("/spec/template/metadata/labels")
        );
        assert_eq!(pod["metadata"]["name"], "kuport-agent-worker-b");
        assert_eq!(pod["spec"]["nodeName"], "worker-b");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    }

    /// Against the real control plane a pod is listed only in slices of the families its Pod
    /// reports: every lab pod reports both addresses, IPv4 first, whatever its Service's
    /// families, so the real EndpointSlice controller writes the IPv6 slices a scenario asks for.
    #[test]
    fn a_pod_reports_both_its_addresses_as_a_dual_stack_kubelet_does() {
        let spec: crate::scenario::PodSpec =
            serde_saphyr::from_str("{namespace: games, name: game-0, node: worker-b}")
                .expect("a pod");
        let pod = PodInfo {
            spec,
            ns: "kl-pod-1".to_owned(),
            ip: "10.244.2.10".parse().expect("IPv4"),
            ip6: "fd00:10:244:2::10".parse().expect("IPv6"),
            node: "worker-b".to_owned(),
            ready: false,
            responders: Default::default(),
        };
        let status = pod_status(&pod, "2026-01-01T00:00:00Z");
        assert_eq!(status["status"]["podIP"], "10.244.2.10");
        assert_eq!(
            status["status"]["podIPs"],
            json!([{"ip": "10.244.2.10"}, {"ip": "fd00:10:244:2::10"}])
        );
        assert_eq!(status["status"]["conditions"][0]["status"], "False");
    }
}
