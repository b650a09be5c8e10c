//! `kuport status --wait`: it reads the cluster again until everything is programmed or the
//! time is up, against the API server model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kuport_core::api::PortMap;
use kuport_sim::apiserver::{ApiServer, Failure, RequestFilter, kubeconfig};
use kuport_testkit::cluster::typed;
use kuport_testkit::objects::{DAEMONSET_NAMESPACE, agent_daemonset, pm};
use kuport_testkit::wait::eventually;
use serde_json::json;

/// The model on a loopback port, a client of it, and its kubeconfig written in `dir`.
async fn model(dir: &Path) -> (ApiServer, kube::Client, PathBuf) {
    let server = ApiServer::builder().build().expect("model builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(server.clone().serve(listener));
    let kubeconfig_path = dir.join("kubeconfig");
    std::fs::write(&kubeconfig_path, kubeconfig(&url)).expect("kubeconfig");
    let client =
        kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
    (server, client, kubeconfig_path)
}

fn status(kubeconfig: &Path, wait: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuport"))
        .args(["status", "--wait", wait, "--kubeconfig"])
        .arg(kubeconfig)
        .output()
        .expect("running kuport")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_returns_once_the_cluster_is_healthy_and_gives_up_with_the_last_reading() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (server, client, kubeconfig) = model(dir.path()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["games", DAEMONSET_NAMESPACE] {
        let namespace: Namespace = typed(json!({"metadata": {"name": ns}}), "Namespace");
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("create the namespace");
    }
    // kuport's DaemonSet, on a cluster without Nodes: nothing is asked of it. Without it the
    // reading would never be healthy.
    let ds: DaemonSet = typed(agent_daemonset(), "DaemonSet");
    Api::<DaemonSet>::namespaced(client.clone(), DAEMONSET_NAMESPACE)
        .create(&PostParams::default(), &ds)
        .await
        .expect("create the DaemonSet");
    let api: Api<PortMap> = Api::namespaced(client, "games");
    // A PortMap of a class that does not exist: not accepted, a problem.
    let broken: PortMap = typed(pm("games", "gs", "absent", 3000).object(), "PortMap");
    api.create(&PostParams::default(), &broken)
        .await
        .expect("create the PortMap");

    // The control: it stays broken, so waiting a second ends with that reading.
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || status(&k, "1s"))
        .await
        .expect("join");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("games/gs"));

    // Fixed while it waits: it returns healthy, well before its minute is up. The fix comes
    // only once its first reading has listed the PortMaps (the Events, listed after them, are
    // refused once with a 429, which marks that moment), so that reading saw it broken.
    let faults = server.faults();
    faults.fail_next(
        1,
        Failure::TooManyRequests,
        RequestFilter::any().resource("events"),
    );
    let k = kubeconfig.clone();
    let waiting = tokio::task::spawn_blocking(move || status(&k, "60s"));
    eventually(
        "kuport status has made its first reading",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || async { faults.injected() == 1 },
    )
    .await;
    api.delete("gs", &DeleteParams::default())
        .await
        .expect("delete the PortMap");
    let out = waiting.await.expect("join");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn wait_is_refused_with_recorded_objects_and_a_malformed_duration() {
    let dump = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/status/empty.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_kuport"))
        .args(["status", "--wait", "5s", "--objects"])
        .arg(&dump)
        .output()
        .expect("running kuport");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--wait"));
    let out = Command::new(env!("CARGO_BIN_EXE_kuport"))
        .args(["status", "--wait", "5x"])
        .output()
        .expect("running kuport");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("s, m or h"));
}

#[test]
fn wait_keeps_trying_an_unreadable_cluster_then_exits_4() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("kubeconfig");
    // Port 1 on loopback: nothing listens there.
    std::fs::write(&path, kubeconfig("http://127.0.0.1:1")).expect("kubeconfig");
    let out = status(&path, "1s");
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
