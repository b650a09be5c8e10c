//! The optional kube-controller-manager: with only the controllers a test names, the real
//! EndpointSlice controller writes slices for ready Pods (IPv6 slices too: the control plane is
//! dual-stack) and the real node-lifecycle controller marks a Node whose heartbeats stopped as
//! not ready. These are what a lab against the real control plane relies on instead of writing
//! slices and readiness itself.

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

/// The control plane is dual-stack: a Service asking for IPv6 gets a cluster IP of each family
/// it names, from the two Service ranges, and the EndpointSlice controller lists a dual-stack
/// Pod in an IPv6 slice at its IPv6 address, for a dual-stack and an IPv6-only Service alike;
/// a Service that names no family stays IPv4 alone, as on a single-stack control plane. (On a
/// single-stack one the API server refuses the first two Services.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpointslice_controller_writes_ipv6_slices_for_dual_stack_pods() {
    let options = Options {
        controllers: vec!["endpointslice-controller".to_owned()],
        ..Options::default()
    };
    let Some(cp) = ControlPlane::start_or_skip(
        "endpointslice_controller_writes_ipv6_slices_for_dual_stack_pods",
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
    Api::<ServiceAccount>::namespaced(client.clone(), "games")
        .create(&pp, &from(json!({"metadata": {"name": "default"}})))
        .await
        .expect("default service account");
    node(&client, "n1").await;
    let services: Api<Service> = Api::namespaced(client.clone(), "games");
    let families = [
        ("dual", json!(["IPv4", "IPv6"]), "RequireDualStack"),
        ("v6", json!(["IPv6"]), "SingleStack"),
    ];
    for (name, ip_families, policy) in families {
        let svc = json!({"metadata": {"name": name},
            "spec": {"selector": {"app": "game"}, "ipFamilies": ip_families, "ipFamilyPolicy": policy,
                     "ports": [{"name": "game", "protocol": "UDP", "port": 3000}]}});
        services
            .create(&pp, &from(svc))
            .await
            .unwrap_or_else(|e| panic!("Service {name} ({policy}): {e}"));
    }
    let v4 = json!({"metadata": {"name": "v4"}, "spec": {"selector": {"app": "game"},
        "ports": [{"name": "game", "protocol": "UDP", "port": 3000}]}});
    services.create(&pp, &from(v4)).await.expect("Service v4");
    let cluster_ips = |svc: Service| svc.spec.and_then(|s| s.cluster_ips).unwrap_or_default();
    let dual = cluster_ips(services.get("dual").await.expect("Service dual"));
    assert_eq!(dual.len(), 2, "{dual:?}");
    assert!(
        dual[0].starts_with("10.0.0.") && dual[1].starts_with("fd00:10::"),
        "{dual:?}"
    );
    let v4 = services.get("v4").await.expect("Service v4");
    let v4_families = v4.spec.as_ref().and_then(|s| s.ip_families.clone());
    assert_eq!(v4_families, Some(vec!["IPv4".to_owned()]));
    dual_stack_pod(&client, "10.244.1.5", "fd00:10:244:1::5").await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "games");
    eventually(
        "the slices of all three Services",
        Duration::from_secs(30),
        || async {
            let all = slices
                .list(&ListParams::default())
                .await
                .expect("list slices")
                .items;
            let listed = |service: &str, family: &str| -> Vec<String> {
                all.iter()
                    .filter(|s| {
                        s.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("kubernetes.io/service-name"))
                            .map(String::as_str)
                            == Some(service)
                    })
                    .filter(|s| s.address_type == family)
                    .flat_map(|s| {
                        s.endpoints
                            .iter()
                            .flatten()
                            .flat_map(|e| e.addresses.clone())
                    })
                    .collect()
            };
            listed("dual", "IPv4") == ["10.244.1.5"]
                && listed("dual", "IPv6") == ["fd00:10:244:1::5"]
                && listed("v6", "IPv6") == ["fd00:10:244:1::5"]
                && listed("v6", "IPv4").is_empty()
                && listed("v4", "IPv4") == ["10.244.1.5"]
                && listed("v4", "IPv6").is_empty()
        },
    )
    .await;
}

/// A ready Pod `game-0` (label `app: game`) on n1 with the two addresses a dual-stack kubelet
/// reports, IPv4 first.
async fn dual_stack_pod(client: &kube::Client, ip: &str, ip6: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "games");
    let container = json!({"name": "game", "image": "game:1"});
    pods.create(
        &PostParams::default(),
        &from(bound_pod("game-0", "game", "n1", container)),
    )
    .await
    .expect("pod");
    pods.patch_status(
        "game-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}, {"ip": ip6}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }})),
    )
    .await
    .expect("pod status");
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
