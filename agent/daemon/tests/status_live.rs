//! `kuport status` reading a live API server: the agents' DaemonSet and Pods found by label
//! (against the API server model), and a user whose RBAC covers one namespace (against a real
//! kube-apiserver, which enforces RBAC; the model has none).

mod live;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams};
use kuport_core::api::PortMap;
use kuport_testkit::objects::{self, DAEMONSET_NAMESPACE, agent_daemonset, agent_pod, pm};
use live::{create, said};
use serde_json::{Value, json};

fn status(kubeconfig: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuport"))
        .arg("status")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .output()
        .expect("running kuport")
}

/// A ready agent Pod on `node`.
fn ready_agent_pod(node: &str, uid: &str) -> Value {
    let mut pod = agent_pod(node, uid);
    pod["status"] = json!({"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "agent", "ready": true, "restartCount": 2,
            "image": "kuport", "imageID": "", "state": {"running": {}}}]});
    pod
}

/// The model on a loopback port with two Ready Nodes, kuport's DaemonSet and an agent Pod on
/// n1 only, plus a Pod of someone else's on n2 (not an agent: no kuport label).
async fn model_cluster(dir: &Path) -> PathBuf {
    let (path, client) = live::serve_model(dir).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [DAEMONSET_NAMESPACE, "games"] {
        create(&namespaces, json!({"metadata": {"name": ns}}), "Namespace").await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, ip) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2")] {
        create(&nodes, objects::node(n, Some(ip), true), "Node").await;
    }
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), DAEMONSET_NAMESPACE);
    create(&ds, agent_daemonset(), "DaemonSet").await;
    let uid = ds
        .get(objects::AGENT_DAEMONSET)
        .await
        .expect("the DaemonSet")
        .metadata
        .uid
        .expect("a uid");
    let pods: Api<Pod> = Api::namespaced(client.clone(), DAEMONSET_NAMESPACE);
    create(&pods, ready_agent_pod("n1", &uid), "Pod").await;
    let games: Api<Pod> = Api::namespaced(client, "games");
    create(
        &games,
        objects::bound_pod("web-0", "web", "n2", json!({"name": "web", "image": "web"})),
        "Pod",
    )
    .await;
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_are_read_by_label_and_a_node_without_one_is_named() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kubeconfig = model_cluster(dir.path()).await;
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || status(&k, &[]))
        .await
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        text.starts_with("Agents: DaemonSet kuport-system/kuport-agent: 0 desired"),
        "{text}"
    );
    let n1 = text
        .lines()
        .find(|l| l.starts_with("n1 "))
        .expect("n1's line");
    assert!(n1.contains("ready") && n1.contains(" 2 "), "{n1}");
    let n2 = text
        .lines()
        .find(|l| l.starts_with("n2 "))
        .expect("n2's line");
    assert!(n2.contains("MISSING"), "the web Pod is no agent: {n2}");
    assert!(
        text.contains("- node n2 has no running agent: no kuport agent Pod runs there"),
        "{text}"
    );

    // JSON carries the same table, beside the fields it always had.
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || status(&k, &["-o", "json"]))
        .await
        .expect("join");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["agents"][1]["node"], "n2");
    assert_eq!(doc["agents"][1]["state"], "missing");
    assert_eq!(doc["agents"][0]["pod"], "kuport-system/kuport-agent-n1");
    assert_eq!(doc["daemonSets"][0]["name"], "kuport-agent");
    assert_eq!(doc["unread"], json!([]));
    for field in ["ok", "mappings", "classes", "problems"] {
        assert!(doc.get(field).is_some(), "{field} is kept");
    }

    // Looked for in another namespace, there is no DaemonSet at all.
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || status(&k, &["--agent-namespace", "games"]))
        .await
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        text.contains(
            "- no kuport DaemonSet found (label app.kubernetes.io/name=kuport in namespace games)"
        ),
        "{text}"
    );
    assert!(!text.contains("Everything is programmed"), "{text}");
}

/// The Role of a tenant of namespace `games`: what the built-in `view` role gives on the kinds
/// `kuport status` reads (with the aggregated PortMap rule).
fn tenant_role() -> Value {
    json!({"metadata": {"name": "tenant", "namespace": "games"},
    "rules": [
        {"apiGroups": ["kuport.wlz.li"], "resources": ["portmaps"], "verbs": ["get", "list"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["events", "pods"], "verbs": ["get", "list"]},
    ]})
}

/// A ServiceAccount `games/<name>` and a kubeconfig with a token for it.
async fn account(cp: &kuport_realapi::ControlPlane, admin: &kube::Client, name: &str) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "games");
    create(
        &accounts,
        json!({"metadata": {"name": name}}),
        "ServiceAccount",
    )
    .await;
    let token = cp.unbound_token("games", name).await.expect("a token");
    let path = cp.kubeconfig().with_file_name(format!("{name}.kubeconfig"));
    cp.service_account_kubeconfig("games", name, &token, &path)
        .expect("the kubeconfig");
    path
}

/// The real cluster: CRDs, namespace `games` with a PortMap whose written status says
/// Programmed, a Node, the DaemonSet and its Pod; a tenant bound in `games` only, and a reader
/// bound to the role docs/operations.md documents.
async fn real_cluster(test: &str) -> Option<(kuport_realapi::ControlPlane, PathBuf, PathBuf)> {
    let cp = kuport_realapi::ControlPlane::start_or_skip(test, Default::default()).await?;
    cp.install_crds(Path::new(kuport_realapi::CRD_DIR))
        .await
        .expect("the CRDs install");
    let admin = cp.admin_client().await.expect("admin client");
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for ns in ["games", DAEMONSET_NAMESPACE] {
        create(&namespaces, json!({"metadata": {"name": ns}}), "Namespace").await;
    }
    create(
        &Api::<Node>::all(admin.clone()),
        objects::node("n1", Some("10.0.0.1"), true),
        "Node",
    )
    .await;
    let portmaps: Api<PortMap> = Api::namespaced(admin.clone(), "games");
    create(
        &portmaps,
        pm("games", "gs", "public", 3000).object(),
        "PortMap",
    )
    .await;
    let written = json!({"status": {"observedGeneration": 1, "conditions": [
        {"type": "Accepted", "status": "True", "reason": "Valid", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
        {"type": "Programmed", "status": "True", "reason": "AllNodesReady", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}});
    portmaps
        .patch_status("gs", &PatchParams::default(), &Patch::Merge(&written))
        .await
        .expect("write the status");
    create(
        &Api::<DaemonSet>::namespaced(admin.clone(), DAEMONSET_NAMESPACE),
        agent_daemonset(),
        "DaemonSet",
    )
    .await;

    let tenant = account(&cp, &admin, "tenant").await;
    create(
        &Api::<Role>::namespaced(admin.clone(), "games"),
        tenant_role(),
        "Role",
    )
    .await;
    create(
        &Api::<RoleBinding>::namespaced(admin.clone(), "games"),
        json!({"metadata": {"name": "tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"kind": "ServiceAccount", "namespace": "games", "name": "tenant"}]}),
        "RoleBinding",
    )
    .await;

    let reader = account(&cp, &admin, "reader").await;
    let docs = live::documented_rbac("status-reader-rbac");
    live::bind(&admin, docs, "games", "reader").await;
    Some((cp, tenant, reader))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_gets_what_their_namespace_shows_and_a_note_for_the_rest() {
    let Some((cp, tenant, reader)) = real_cluster("status_live::rbac").await else {
        return;
    };
    // RBAC bindings take effect at once on the apiserver (no cache to wait for).
    let t = tenant.clone();
    let out = tokio::task::spawn_blocking(move || status(&t, &["-n", "games"]))
        .await
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        text.contains("PortMaps in namespace games: 1/1 programmed"),
        "{text}"
    );
    assert!(text.contains("games/gs"), "{text}");
    assert!(
        text.starts_with("Agents: the DaemonSets could not be read"),
        "{text}"
    );
    for what in [
        "- PortMapClasses: forbidden",
        "- Nodes: forbidden",
        "- Namespaces: forbidden",
        "- DaemonSets: forbidden",
        "- Pods: forbidden",
        "- PortMaps in other namespaces: forbidden",
    ] {
        assert!(text.contains(what), "{what:?} missing from:\n{text}");
    }
    assert!(!text.contains("Everything is programmed"), "{text}");
    assert!(stderr.contains("warning: could not read"), "{stderr}");

    // One mapping explained: its written status, and what could not be computed, rather
    // than a class "that does not exist".
    let t = tenant.clone();
    let out = tokio::task::spawn_blocking(move || status(&t, &["games/gs"]))
        .await
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(text.contains("not computed: PortMapClasses"), "{text}");
    assert!(!text.contains("no PortMapClass named"), "{text}");

    // Without -n there is nothing to report on: exit 4, saying what to give.
    let t = tenant.clone();
    let out = tokio::task::spawn_blocking(move || status(&t, &[]))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("give -n NAMESPACE"),
        "{}",
        said(&out)
    );

    // The documented role reads everything: nothing is left out, and the agents are checked
    // (n1 has no agent Pod, so this reading is not healthy).
    let out = tokio::task::spawn_blocking(move || status(&reader, &[]))
        .await
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(!text.contains("Not read"), "{text}");
    assert!(
        text.contains("- node n1 has no running agent: no kuport agent Pod runs there"),
        "{text}"
    );
    assert!(
        cp.forbidden_requests("system:serviceaccount:games:reader")
            .expect("the audit log")
            .is_empty(),
        "the documented role covers every read"
    );
}
