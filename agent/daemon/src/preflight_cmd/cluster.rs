//! The preconditions `kuport preflight` checks from the API server alone: an agent ready on
//! every node tested, the Pod Security level of the agents' namespace, every node's
//! InternalIP, and the link port against the CNI's overlay port. The reading is thin; the
//! checks are pure over what it read.

use std::collections::BTreeSet;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kuport_core::api::NodeCheck;
use kuport_core::snapshot::{CILIUM_CONFIG, CniFacts, node_internal_ip};

use crate::objects::Dump;
use crate::status_cmd::agents::{AgentSelector, AgentState, agent_state_text, agents};

/// The Pod Security label the agents' namespace needs, and its value.
pub const POD_SECURITY_LABEL: (&str, &str) = ("pod-security.kubernetes.io/enforce", "privileged");

/// Names of the cluster checks.
pub mod names {
    pub const AGENTS: &str = "agents";
    pub const POD_SECURITY: &str = "podSecurity";
    pub const INTERNAL_IP: &str = "internalIP";
    pub const LINK_PORT: &str = "linkPort";
}

/// Reads what the cluster checks need: Nodes, Namespaces, kuport's DaemonSets and agent Pods
/// (by `selector`), and `kube-system/cilium-config`. Any error ends the reading (the preflight
/// needs all of it).
pub async fn read(client: &kube::Client, selector: &AgentSelector) -> anyhow::Result<Dump> {
    let all = ListParams::default();
    let mut dump = Dump::default();
    dump.snapshot.nodes = Api::<Node>::all(client.clone())
        .list(&all)
        .await
        .context("listing Nodes")?
        .items;
    dump.snapshot.namespaces = Api::<Namespace>::all(client.clone())
        .list(&all)
        .await
        .context("listing Namespaces")?
        .items;
    let (ds_api, pod_api) = match &selector.namespace {
        None => (
            Api::<DaemonSet>::all(client.clone()),
            Api::<Pod>::all(client.clone()),
        ),
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
    };
    dump.daemon_sets = Some(ds_api.list(&all).await.context("listing DaemonSets")?.items);
    let params = ListParams::default().labels(&selector.label_selector());
    dump.pods = Some(
        pod_api
            .list(&params)
            .await
            .context("listing the agent Pods")?
            .items,
    );
    let (cm_ns, cm_name) = CILIUM_CONFIG;
    dump.snapshot.cni = Api::<ConfigMap>::namespaced(client.clone(), cm_ns)
        .get_opt(cm_name)
        .await
        .with_context(|| format!("reading ConfigMap {cm_ns}/{cm_name}"))?
        .as_ref()
        .map(CniFacts::from_cilium_config);
    Ok(dump)
}

fn check(name: &str, ok: Option<bool>, message: String) -> NodeCheck {
    NodeCheck {
        name: name.to_owned(),
        ok,
        message,
    }
}

/// The cluster checks, and why the links cannot be tested at all (no agents, or the link port
/// is the CNI's: the class would build nothing).
pub struct ClusterChecks {
    pub checks: Vec<NodeCheck>,
    pub links_untestable: Option<String>,
}

/// The cluster checks over `dump`, for the nodes `tested` and the link `port`.
pub fn checks(
    dump: &Dump,
    selector: &AgentSelector,
    tested: &[String],
    port: u16,
    now: Timestamp,
) -> ClusterChecks {
    let needed: BTreeSet<String> = tested.iter().cloned().collect();
    let found = agents(dump, selector, &needed, now);
    let daemon_sets = found.daemon_sets.clone().unwrap_or_default();
    let agents_check = match daemon_sets.first() {
        None => check(
            names::AGENTS,
            Some(false),
            format!(
                "no kuport DaemonSet found ({}): install the agent first (docs/integration.md, section 2)",
                selector.describe()
            ),
        ),
        Some(ds) => {
            let not_ready: Vec<String> = tested
                .iter()
                .filter_map(|n| {
                    let a = found.of(n)?;
                    (a.state != AgentState::Ready).then(|| format!("{n} ({})", agent_state_text(a)))
                })
                .collect();
            if not_ready.is_empty() {
                check(
                    names::AGENTS,
                    Some(true),
                    format!(
                        "DaemonSet {}/{}: a ready agent on each of the {} nodes",
                        ds.namespace,
                        ds.name,
                        tested.len()
                    ),
                )
            } else {
                check(
                    names::AGENTS,
                    Some(false),
                    format!(
                        "DaemonSet {}/{} has no ready agent on {}",
                        ds.namespace,
                        ds.name,
                        not_ready.join(", ")
                    ),
                )
            }
        }
    };
    let namespace = daemon_sets.first().map(|ds| ds.namespace.clone());
    let port_check = link_port(dump.snapshot.cni.as_ref(), port);
    let links_untestable = if daemon_sets.is_empty() {
        Some("no kuport agent runs to build and probe the links".to_owned())
    } else if port_check.ok == Some(false) {
        Some(format!("the link port {port} is the CNI's own VXLAN port"))
    } else {
        None
    };
    ClusterChecks {
        checks: vec![
            agents_check,
            pod_security(dump, namespace.as_deref()),
            internal_ips(dump, tested),
            port_check,
        ],
        links_untestable,
    }
}

/// The agents' namespace must enforce the `privileged` level: the agent runs with hostNetwork
/// and NET_ADMIN, which no other level admits (an agent Pod recreated after a stricter label
/// was set would be refused).
fn pod_security(dump: &Dump, namespace: Option<&str>) -> NodeCheck {
    let name = names::POD_SECURITY;
    let Some(ns) = namespace else {
        return check(
            name,
            None,
            "not checked: no kuport DaemonSet, so no namespace to check".to_owned(),
        );
    };
    let (key, want) = POD_SECURITY_LABEL;
    let label = dump
        .snapshot
        .namespaces
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(ns))
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(key));
    match label {
        Some(v) if v == want => check(name, Some(true), format!("namespace {ns} has {key}={want}")),
        Some(v) => check(
            name,
            Some(false),
            format!(
                "namespace {ns} has {key}={v}: the agent Pods need {want} (hostNetwork, NET_ADMIN); kubectl label namespace {ns} --overwrite {key}={want}"
            ),
        ),
        None => check(
            name,
            Some(false),
            format!(
                "namespace {ns} has no {key} label: the cluster's default level decides whether an agent Pod is admitted, and it needs {want}; kubectl label namespace {ns} {key}={want}"
            ),
        ),
    }
}

/// Links are built between InternalIPs: a node without one gets none.
fn internal_ips(dump: &Dump, tested: &[String]) -> NodeCheck {
    let name = names::INTERNAL_IP;
    let missing: Vec<&str> = tested
        .iter()
        .filter(|n| {
            !dump.snapshot.nodes.iter().any(|node| {
                node.metadata.name.as_deref() == Some(n.as_str())
                    && node_internal_ip(node).is_some()
            })
        })
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        check(
            name,
            Some(true),
            "every node has an IPv4 InternalIP".to_owned(),
        )
    } else {
        check(
            name,
            Some(false),
            format!(
                "no IPv4 InternalIP on {}: no return link can reach it (set the kubelet's --node-ip to its mesh address)",
                missing.join(", ")
            ),
        )
    }
}

/// The link port must differ from the CNI's own VXLAN port.
fn link_port(cni: Option<&CniFacts>, port: u16) -> NodeCheck {
    let name = names::LINK_PORT;
    match cni {
        None => check(
            name,
            None,
            format!(
                "not checked: no kube-system/cilium-config; {port} must differ from your CNI's VXLAN port (4789 on Calico, 8472 on Flannel)"
            ),
        ),
        Some(c) if c.vxlan_port == port => check(
            name,
            Some(false),
            format!(
                "the link port {port} is the VXLAN port of {} (tunnel-port in cilium-config): give another --port, and use it as the classes' returnPath.vxlan.port",
                c.name
            ),
        ),
        Some(c) => check(
            name,
            Some(true),
            format!(
                "the link port {port} differs from the VXLAN port of {} ({})",
                c.name, c.vxlan_port
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_port_is_checked_against_the_cnis_only_when_known() {
        assert_eq!(link_port(None, 4790).ok, None);
        let cilium = CniFacts {
            name: "cilium".into(),
            routing_mode: None,
            vxlan_port: 8472,
            pod_cidrs: Vec::new(),
            host_legacy_routing: None,
            bpf_masquerade: None,
        };
        assert_eq!(link_port(Some(&cilium), 4790).ok, Some(true));
        let clash = link_port(Some(&cilium), 8472);
        assert_eq!(clash.ok, Some(false));
        assert!(clash.message.contains("--port"), "{}", clash.message);
    }
}
