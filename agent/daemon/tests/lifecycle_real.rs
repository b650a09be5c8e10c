//! What a stopping agent does with the datapath when its credentials die, against a real
//! kube-apiserver: the agent authenticates with a token bound to its own Pod, as the kubelet
//! projects it, so deleting that Pod (or its ServiceAccount) makes every request answer 401.
//!
//! - A force-deleted agent Pod: the DaemonSet stands and its next Pod is starting on the node;
//!   the old agent is stopped with every read refused 401 and must keep the datapath.
//! - An uninstall: the DaemonSet is deleted, then the ServiceAccount (as `helm uninstall` and
//!   `kubectl delete -f` do, moments apart); the stopping agent's reads are refused 401 too, but
//!   it saw the DaemonSet go while it ran, and removes the datapath.
//!
//! Each case is the other's control: a rule that tears down on any 401 fails the first, one
//! that keeps on any 401 fails the second.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kuport::agent::{Agent, AgentConfig, CancellationToken, StopPolicy};
use kuport_core::snapshot::HostFacts;
use kuport_host::MemoryHost;
use kuport_realapi::ControlPlane;
use kuport_testkit::objects::{
    self, AGENT_ACCOUNT, AGENT_DAEMONSET, DAEMONSET_NAMESPACE, agent_daemonset, agent_pod,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(30);

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("object")
}

async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    kuport_testkit::wait::eventually(what, DEADLINE, Duration::from_millis(50), check).await;
}

/// The control plane with the CRDs, the agents' ServiceAccount under the shipped roles, Node
/// `n1` and the DaemonSet; `None` when it is not built here.
async fn cluster(test: &str) -> Option<(ControlPlane, kube::Client, String)> {
    let cp = ControlPlane::start_or_skip(test, Default::default()).await?;
    cp.install_crds(std::path::Path::new(kuport_realapi::CRD_DIR))
        .await
        .expect("the shipped CRDs install");
    let role = kuport_realapi::agent_role().expect("the agent's ClusterRole");
    cp.create_service_account(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, &role)
        .await
        .expect("the agents' ServiceAccount");
    let admin = cp.admin_client().await.expect("admin client");
    let pp = PostParams::default();
    Api::<Node>::all(admin.clone())
        .create(&pp, &from(objects::node("n1", Some("10.0.0.1"), true)))
        .await
        .expect("node");
    let ds: DaemonSet = Api::namespaced(admin.clone(), DAEMONSET_NAMESPACE)
        .create(&pp, &from(agent_daemonset()))
        .await
        .expect("daemonset");
    let uid = ds.metadata.uid.expect("a uid");
    Some((cp, admin, uid))
}

/// An agent for `n1` authenticated with a token bound to its Pod (created here), knowing its
/// Pod: returns its host, its shutdown and its task.
async fn start_agent(
    cp: &ControlPlane,
    admin: &kube::Client,
    ds_uid: &str,
) -> (
    MemoryHost,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), kuport::agent::AgentError>>,
    kube::Client,
    kuport::agent::Health,
) {
    let pod = format!("{AGENT_DAEMONSET}-n1");
    Api::<Pod>::namespaced(admin.clone(), DAEMONSET_NAMESPACE)
        .create(&PostParams::default(), &from(agent_pod("n1", ds_uid)))
        .await
        .expect("the agent's Pod");
    let token = cp
        .pod_token(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, &pod)
        .await
        .expect("a token bound to the Pod");
    let client = cp
        .client_with_token(DAEMONSET_NAMESPACE, AGENT_ACCOUNT, &token)
        .await
        .expect("the agent's client");
    let host = MemoryHost::with_facts(HostFacts::default());
    let mut config = AgentConfig::new("n1");
    config.stop_policy = StopPolicy::Owner {
        pod,
        namespace: DAEMONSET_NAMESPACE.to_owned(),
    };
    config.api_timeout = Duration::from_secs(2);
    config.retry_min = Duration::from_millis(50);
    config.retry_max = Duration::from_millis(500);
    let agent = Agent::new(client.clone(), host.clone(), config);
    let health = agent.health();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(agent.run(shutdown.clone()));
    eventually("the agent is ready", || async { health.is_ready() }).await;
    // The agent reads its Pod and starts watching its DaemonSet in the background.
    eventually("the agent watches its DaemonSet and namespace", || async {
        health.is_watching_removal()
    })
    .await;
    (host, shutdown, task, client, health)
}

/// Waits until the agent's credentials are refused (401).
async fn until_unauthorized(client: &kube::Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("the agent's token is refused with 401", || async {
        matches!(nodes.get("n1").await, Err(kube::Error::Api(s)) if s.code == 401)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_deleted_agent_pod_keeps_the_datapath_though_its_token_is_refused() {
    let test = "a_force_deleted_agent_pod_keeps_the_datapath_though_its_token_is_refused";
    let Some((cp, admin, uid)) = cluster(test).await else {
        return;
    };
    let (host, shutdown, task, client, _health) = start_agent(&cp, &admin, &uid).await;
    Api::<Pod>::namespaced(admin.clone(), DAEMONSET_NAMESPACE)
        .delete(
            &format!("{AGENT_DAEMONSET}-n1"),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .expect("force-delete the agent's Pod");
    until_unauthorized(&client).await;
    shutdown.cancel();
    task.await.expect("agent task").expect("a clean stop");
    assert_eq!(
        host.lock().teardowns,
        0,
        "a 401 must not remove what the DaemonSet's next agent adopts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninstall_removes_the_datapath_though_the_token_died_before_the_stop() {
    let test = "an_uninstall_removes_the_datapath_though_the_token_died_before_the_stop";
    let Some((cp, admin, uid)) = cluster(test).await else {
        return;
    };
    let (host, shutdown, task, client, health) = start_agent(&cp, &admin, &uid).await;
    Api::<DaemonSet>::namespaced(admin.clone(), DAEMONSET_NAMESPACE)
        .delete(AGENT_DAEMONSET, &DeleteParams::default())
        .await
        .expect("delete the DaemonSet");
    eventually("the agent saw its DaemonSet deleted", || async {
        health.has_seen_removal()
    })
    .await;
    Api::<ServiceAccount>::namespaced(admin.clone(), DAEMONSET_NAMESPACE)
        .delete(AGENT_ACCOUNT, &DeleteParams::default())
        .await
        .expect("delete the ServiceAccount");
    until_unauthorized(&client).await;
    shutdown.cancel();
    task.await.expect("agent task").expect("a clean stop");
    assert_eq!(
        host.lock().teardowns,
        1,
        "the DaemonSet's deletion, seen while the agent ran, removes the datapath"
    );
}
