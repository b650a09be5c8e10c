//! The optional kube-controller-manager: with only the controllers a test names, the real
//! EndpointSlice controller writes slices for ready Pods and the real node-lifecycle controller
//! marks a Node whose heartbeats stopped as not ready. These are what a lab against the real
//! control plane relies on instead of writing slices and readiness itself.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kuport_realapi::{ControlPlane, Options};
use kuport_testkit::objects::{bound_pod, kubelet_node_status};
use serde_json::{Value, json};

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

/// Now, to the second, as the kubelet writes heartbeats (RFC 3339, UTC).
fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .expect("rounding now to the second")
}

/// Waits until `check` holds, polling every 200 ms (the controllers act in seconds).
async fn eventually<F, Fut>(what: &str, deadline: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    kuport_testkit::wait::eventually(what, deadline, Duration::from_millis(200), check).await;
}

async fn node(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let heartbeat = now();
    nodes
        .create(
            &PostParams::default(),
            &from(json!({
                "metadata": {"name": name},
                "status": kubelet_node_status("10.0.0.1", true, &heartbeat),
            })),
        )
        .await
        .expect("node created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpointslice_controller_writes_slices_for_ready_pods() {
    let options = Options {
        controllers: vec!["endpointslice-controller".to_owned()],
        ..Options::default()
    };
    let Some(cp) = ControlPlane::start_or_skip(
        "endpointslice_controller_writes_slices_for_ready_pods",
        options,
    )
    .await
    else {
        return;
    };
    let client = cp.admin_client().await.expect("admin client");
    let pp = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &from(json!({"metadata": {"name": "games"}})))
        .await
        .expect("namespace");
    // Without the serviceaccount controller nobody makes the namespace's default account,
    // which Pod admission asks for.
    Api::<ServiceAccount>::namespaced(client.clone(), "games")
        .create(&pp, &from(json!({"metadata": {"name": "default"}})))
        .await
        .expect("default service account");
    node(&client, "n1").await;
    Api::<Service>::namespaced(client.clone(), "games")
        .create(
            &pp,
            &from(json!({
                "metadata": {"name": "gameserver"},
                "spec": {"selector": {"app": "game"},
                         "ports": [{"name": "game", "protocol": "UDP", "port": 3000}]},
            })),
        )
        .await
        .expect("service");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "games");
    let container = json!({"name": "game", "image": "game:1",
                           "ports": [{"name": "game", "containerPort": 3000, "protocol": "UDP"}]});
    pods.create(
        &pp,
        &from(bound_pod("gameserver-0", "game", "n1", container)),
    )
    .await
    .expect("pod");
    // What the kubelet would report.
    pods.patch_status(
        "gameserver-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }})),
    )
    .await
    .expect("pod status");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "games");
    let selected = ListParams::default().labels("kubernetes.io/service-name=gameserver");
    eventually(
        "a slice with the ready pod",
        Duration::from_secs(30),
        || async {
            slices
                .list(&selected)
                .await
                .expect("list slices")
                .items
                .iter()
                .any(|s| {
                    s.endpoints.iter().flatten().any(|e| {
                        e.addresses == ["10.244.1.5"]
                            && e.node_name.as_deref() == Some("n1")
                            && e.conditions.as_ref().and_then(|c| c.ready) == Some(true)
                    }) && s.ports.as_ref().is_some_and(|ps| {
                        ps.iter()
                            .any(|p| p.name.as_deref() == Some("game") && p.port == Some(3000))
                    })
                })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lifecycle_controller_marks_a_silent_node_not_ready() {
    let options = Options {
        controllers: vec!["node-lifecycle-controller".to_owned()],
        ..Options::default()
    };
    let Some(cp) = ControlPlane::start_or_skip(
        "node_lifecycle_controller_marks_a_silent_node_not_ready",
        options,
    )
    .await
    else {
        return;
    };
    let client = cp.admin_client().await.expect("admin client");
    node(&client, "n1").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    leases
        .create(
            &PostParams::default(),
            &from(json!({
                "metadata": {"name": "n1"},
                "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40,
                         "renewTime": now().replace('Z', ".000000Z")},
            })),
        )
        .await
        .expect("lease");
    // No heartbeat follows: after the 10 s grace period the controller gives up on the node.
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(
        "n1 Ready=Unknown from the node-lifecycle controller",
        Duration::from_secs(60),
        || async {
            let n = nodes.get("n1").await.expect("node");
            n.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "Unknown")
        },
    )
    .await;
}
