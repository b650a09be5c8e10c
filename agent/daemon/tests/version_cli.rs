//! `kuport version` against a live API server (the model): the client's version first, then the
//! agents' versions read from their Pods by label; and, when the cluster cannot be read (nothing
//! listening, or a server that never answers), the client's version still, a note, exit 0.

mod live;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::Api;
use kuport_sim::apiserver::kubeconfig;
use kuport_testkit::objects::{self, DAEMONSET_NAMESPACE, agent_daemonset, agent_pod};
use live::{create, said};
use serde_json::{Value, json};

fn version(kubeconfig: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuport"))
        .arg("version")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .output()
        .expect("running kuport")
}

fn client_line() -> String {
    format!(
        "Client: kuport {} ({}/{})\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// The model with three Nodes and agent Pods on n1 (v0.1.0) and n2 (v0.2.0), mid-rollout; n3
/// runs none, and a Pod of someone else's runs on n3.
async fn model_cluster(dir: &Path) -> PathBuf {
    let (path, client) = live::serve_model(dir).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [DAEMONSET_NAMESPACE, "games"] {
        create(&namespaces, json!({"metadata": {"name": ns}}), "Namespace").await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, ip) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2"), ("n3", "10.0.0.3")] {
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
    for (node, tag) in [("n1", "v0.1.0"), ("n2", "v0.2.0")] {
        let mut pod = agent_pod(node, &uid);
        pod["spec"]["containers"][0]["image"] = json!(format!("ghcr.io/acme/kuport-agent:{tag}"));
        create(&pods, pod, "Pod").await;
    }
    let games: Api<Pod> = Api::namespaced(client, "games");
    create(
        &games,
        objects::bound_pod(
            "web-0",
            "web",
            "n3",
            json!({"name": "web", "image": "web:v9.9.9"}),
        ),
        "Pod",
    )
    .await;
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_versions_are_read_by_label_after_the_client() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kubeconfig = model_cluster(dir.path()).await;
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || version(&k, &[]))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.starts_with(&client_line()), "{text}");
    assert!(
        text.contains(
            "Agents (label app.kubernetes.io/name=kuport in any namespace): 0.1.0, 0.2.0 (more than one"
        ),
        "{text}"
    );
    let line = |node: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{node} ")))
            .map(str::to_owned)
    };
    let n1 = line("n1").expect("n1's line");
    assert!(
        n1.contains(" 0.1.0 ") && n1.ends_with("ghcr.io/acme/kuport-agent:v0.1.0"),
        "{n1}"
    );
    assert!(line("n2").expect("n2's line").contains(" 0.2.0 "));
    assert_eq!(line("n3"), None, "the web Pod is no agent: {text}");

    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || version(&k, &["-o", "json"]))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["client"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(doc["agents"]["versions"], json!(["0.1.0", "0.2.0"]));
    assert_eq!(
        doc["agents"]["nodes"][0]["pod"],
        "kuport-system/kuport-agent-n1"
    );
    assert_eq!(doc["agents"]["nodes"].as_array().map(Vec::len), Some(2));

    // Another namespace holds no agents: said, not an error.
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || version(&k, &["--agent-namespace", "games"]))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("in namespace games): none found"),
        "{}",
        said(&out)
    );

    // --client contacts nothing: the same line alone.
    let out = version(Path::new("/nonexistent/kubeconfig"), &["--client"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), client_line());
}

/// A kubeconfig for a loopback server at `addr`.
fn kubeconfig_for(dir: &Path, addr: std::net::SocketAddr) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, kubeconfig(&format!("http://{addr}"))).expect("kubeconfig");
    path
}

#[test]
fn an_unreadable_cluster_still_prints_the_client_and_exits_0() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // Nothing listens: the port of a listener just closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let out = version(&kubeconfig_for(dir.path(), closed), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&client_line()), "{text}");
    assert!(text.contains("\nAgents: not read: "), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("kuport: warning: could not read the agents' versions"),
        "{}",
        said(&out)
    );

    // A server that accepts and never answers: given up after --timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr");
    let started = std::time::Instant::now();
    let out = version(&kubeconfig_for(dir.path(), addr), &["--timeout", "1s"]);
    drop(silent);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("Agents: not read: the API server did not answer within 1s"),
        "{}",
        said(&out)
    );
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());

    // A bad selector is the command line's fault: exit 2.
    let out = version(
        &kubeconfig_for(dir.path(), addr),
        &["--agent-selector", "x"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
}
