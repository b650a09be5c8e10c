//! `kuport preflight` against the API server model: the test plays the agents, writing their
//! rows into the preflight class once the command created it, and checks the command's verdict
//! and exit status: everything passing, a pair down, a failing node check, a node that never
//! reports, and the cluster's own preconditions; a run stopped by a signal deletes its class,
//! one killed leaves it only until its deadline, and the next run replaces it then.

mod live;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kuport_core::api::{PREFLIGHT_DEADLINE_ANNOTATION, PortMapClass};
use kuport_testkit::objects::{self, DAEMONSET_NAMESPACE, agent_daemonset, agent_pod};
use kuport_testkit::process::{Signal, signal_child};
use live::{create, said};
use serde_json::{Value, json};

const CLASS: &str = "kuport-preflight";
const NODES: [&str; 3] = ["n1", "n2", "n3"];

fn preflight(kubeconfig: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kuport"))
        .arg("preflight")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .output()
        .expect("running kuport")
}

/// The model with three Ready Nodes, kuport's namespace (labelled `privileged` unless
/// `labelled` is false), its DaemonSet and a ready agent Pod on each node in `agents`.
async fn cluster(dir: &Path, labelled: bool, agents: &[&str]) -> (PathBuf, kube::Client) {
    let (path, client) = live::serve_model(dir).await;
    let labels = if labelled {
        json!({"pod-security.kubernetes.io/enforce": "privileged"})
    } else {
        json!({})
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create(
        &namespaces,
        json!({"metadata": {"name": DAEMONSET_NAMESPACE, "labels": labels}}),
        "Namespace",
    )
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, n) in NODES.iter().enumerate() {
        let ip = format!("100.64.0.{}", i + 1);
        create(&nodes, objects::node(n, Some(&ip), true), "Node").await;
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
    for node in agents {
        let mut pod = agent_pod(node, &uid);
        pod["status"] = json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "agent", "ready": true, "restartCount": 0,
                "image": "kuport", "imageID": "", "state": {"running": {}}}]});
        create(&pods, pod, "Pod").await;
    }
    (path, client)
}

/// What one simulated agent writes: its row, with its checks and its ends of the links.
#[derive(Clone)]
struct Agent {
    node: &'static str,
    /// Peers whose link end this node reports, with its verdict (and a message when down).
    links: Vec<(&'static str, bool)>,
    checks: Value,
}

fn healthy_checks() -> Value {
    json!([
        {"name": "internalIP", "ok": true, "message": "the InternalIP is on wt0, which is up"},
        {"name": "ipForward", "ok": true, "message": "net.ipv4.ip_forward is 1"},
        {"name": "cniHostRouting", "message": "not checked: no kube-system/cilium-config was found"},
    ])
}

fn healthy(node: &'static str) -> Agent {
    Agent {
        node,
        links: NODES
            .iter()
            .copied()
            .filter(|p| *p != node)
            .map(|p| (p, true))
            .collect(),
        checks: healthy_checks(),
    }
}

fn row(a: &Agent) -> Value {
    let links: Vec<Value> = a
        .links
        .iter()
        .map(|(peer, up)| {
            let mut l = json!({"peer": peer, "slot": 0, "up": up, "rttMicroseconds": 800});
            if *up {
                l["verifiedMTU"] = json!(1370);
            } else {
                l["message"] = json!(format!(
                    "no answer from {peer} (169.254.112.1) to 3 probes in a row across the link"
                ));
            }
            l
        })
        .collect();
    json!({"name": a.node, "ready": true, "underlayMTU": 1420, "linkMTU": 1370,
           "agentVersion": "test", "links": links, "checks": a.checks})
}

/// Plays the agents: once the command created the class, writes `agents`' rows into it.
async fn play_agents(client: kube::Client, agents: Vec<Agent>) {
    play_agents_replacing(client, agents, None).await;
}

/// [`play_agents`] for a class that replaces one of uid `stale`: rows go to the new one only.
async fn play_agents_replacing(client: kube::Client, agents: Vec<Agent>, stale: Option<String>) {
    let api: Api<PortMapClass> = Api::all(client);
    kuport_testkit::wait::eventually(
        "the preflight class appears",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let class = api.get_opt(CLASS).await.expect("read");
            class.is_some_and(|c| c.metadata.uid != stale)
        },
    )
    .await;
    let rows: Vec<Value> = agents.iter().map(row).collect();
    api.patch_status(
        CLASS,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nodes": rows}})),
    )
    .await
    .expect("write the rows");
}

/// Runs the command while the agents play; returns its output and whether the class is gone.
async fn run(
    kubeconfig: PathBuf,
    client: kube::Client,
    agents: Vec<Agent>,
    extra: &'static [&'static str],
) -> (Output, bool) {
    let agents = tokio::spawn(play_agents(client.clone(), agents));
    let out = tokio::task::spawn_blocking(move || preflight(&kubeconfig, extra))
        .await
        .expect("join");
    agents.await.expect("the agents");
    let gone = Api::<PortMapClass>::all(client)
        .get_opt(CLASS)
        .await
        .expect("read")
        .is_none();
    (out, gone)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_precondition_passing_exits_0_and_deletes_the_class() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (kubeconfig, client) = cluster(dir.path(), true, &NODES).await;
    let agents = NODES.iter().map(|n| healthy(n)).collect();
    let (out, gone) = run(
        kubeconfig.clone(),
        client.clone(),
        agents,
        &["--timeout", "20s"],
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(gone, "the class is deleted");
    for pair in ["n1/n2", "n1/n3", "n2/n3"] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(pair))
            .unwrap_or_else(|| panic!("no line for {pair}: {text}"));
        assert!(
            line.contains("up") && line.contains("MTU 1370 verified (link MTU 1370)"),
            "{line}"
        );
    }
    let n1 = text
        .lines()
        .find(|l| l.trim_start().starts_with("n1 "))
        .expect("n1's line");
    assert!(
        n1.contains("ok    2 passed; not checked: cniHostRouting"),
        "{n1}"
    );
    assert!(text.contains("Every precondition passed."), "{text}");

    // --keep leaves the class, and JSON carries the same verdicts.
    let agents = NODES.iter().map(|n| healthy(n)).collect();
    let (out, gone) = run(
        kubeconfig,
        client,
        agents,
        &["--timeout", "20s", "--keep", "-o", "json"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(!gone, "--keep keeps the class");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["pairs"][0]["key"], "n1/n2");
    assert_eq!(doc["pairs"][0]["state"], "up");
    assert_eq!(doc["pairs"][0]["verifiedMTU"], 1370);
    assert_eq!(doc["problems"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_down_and_a_failing_node_check_each_fail_by_name() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (kubeconfig, client) = cluster(dir.path(), true, &NODES).await;
    let mut n1 = healthy("n1");
    n1.links = vec![("n2", true), ("n3", false)];
    let mut n2 = healthy("n2");
    n2.checks = json!([{"name": "ipForward", "ok": false,
        "message": "net.ipv4.ip_forward is 0: the node forwards nothing"}]);
    let agents = vec![n1, n2, healthy("n3")];
    let (out, gone) = run(kubeconfig, client, agents, &["--timeout", "4s"]).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(gone, "the class is deleted after a failure too");
    assert!(
        text.contains(
            "- pair n1/n3: the link across UDP port 4790 does not pass (n1: no answer from n3"
        ),
        "{text}"
    );
    assert!(
        text.contains("- node n2: ipForward failed: net.ipv4.ip_forward is 0"),
        "{text}"
    );
    let pair = text
        .lines()
        .find(|l| l.trim_start().starts_with("n1/n3"))
        .expect("the pair's line");
    assert!(pair.contains("DOWN"), "{pair}");
    assert!(!text.contains("- pair n1/n2"), "n1/n2 passes: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_names_the_nodes_that_never_reported() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (kubeconfig, client) = cluster(dir.path(), true, &NODES).await;
    // n3's agent never writes: its peers built nothing toward it either.
    let mut n1 = healthy("n1");
    n1.links.retain(|(p, _)| *p != "n3");
    let mut n2 = healthy("n2");
    n2.links.retain(|(p, _)| *p != "n3");
    let (out, _) = run(kubeconfig, client, vec![n1, n2], &["--timeout", "3s"]).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(text.contains("- node n3 never reported"), "{text}");
    assert!(
        text.contains("- pair n1/n3: no passing verdict within the timeout: n1 has not built its end; n3 has not built its end"),
        "{text}"
    );
    assert!(!text.contains("node n1 never"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_preconditions_are_named_and_a_missing_daemonset_skips_the_links() {
    let dir = tempfile::tempdir().expect("temporary directory");
    // No Pod Security label, and no agent on n3.
    let (kubeconfig, client) = cluster(dir.path(), false, &["n1", "n2"]).await;
    let agents = vec![healthy("n1"), healthy("n2"), healthy("n3")];
    let (out, _) = run(
        kubeconfig.clone(),
        client.clone(),
        agents,
        &["--timeout", "10s"],
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        text.contains(
            "- agents: DaemonSet kuport-system/kuport-agent has no ready agent on n3 (MISSING)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "- podSecurity: namespace kuport-system has no pod-security.kubernetes.io/enforce label"
        ),
        "{text}"
    );

    // Without the DaemonSet no agent can build a link: the class is never created.
    Api::<DaemonSet>::namespaced(client.clone(), DAEMONSET_NAMESPACE)
        .delete(objects::AGENT_DAEMONSET, &Default::default())
        .await
        .expect("delete the DaemonSet");
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || preflight(&k, &["--nodes", "n1,n2"]))
        .await
        .expect("join");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(text.contains("Nodes and pairs: not tested"), "{text}");
    assert!(
        text.contains("- agents: no kuport DaemonSet found"),
        "{text}"
    );

    // A node that does not exist is a usage error; an unreachable cluster exits 4.
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || preflight(&k, &["--nodes", "n9"]))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let nowhere = dir.path().join("nowhere");
    std::fs::write(
        &nowhere,
        kuport_sim::apiserver::kubeconfig("http://127.0.0.1:9"),
    )
    .expect("kubeconfig");
    let out = tokio::task::spawn_blocking(move || preflight(&nowhere, &[]))
        .await
        .expect("join");
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
}

/// A run started in the background, its output piped.
fn spawn_preflight(kubeconfig: &Path, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_kuport"))
        .arg("preflight")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kuport")
}

/// Waits until the class of a running preflight exists; returns it.
async fn class_created(api: &Api<PortMapClass>) -> PortMapClass {
    kuport_testkit::wait::eventually(
        "the preflight class appears",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { api.get_opt(CLASS).await.expect("read").is_some() },
    )
    .await;
    api.get(CLASS).await.expect("the class")
}

/// Sends `signal` to a preflight waiting for verdicts that never come, once its class exists;
/// returns how it ended.
async fn signalled(kubeconfig: &Path, api: &Api<PortMapClass>, signal: Signal) -> Output {
    let mut child = spawn_preflight(kubeconfig, &["--timeout", "60s"]);
    class_created(api).await;
    signal_child(&mut child, signal);
    tokio::task::spawn_blocking(move || child.wait_with_output().expect("the run ends"))
        .await
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_deletes_the_class_and_a_killed_runs_class_is_replaced_after_its_deadline() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (kubeconfig, client) = cluster(dir.path(), true, &NODES).await;
    let api: Api<PortMapClass> = Api::all(client.clone());
    // A CI timeout (SIGTERM), a closed ssh session (SIGHUP), Ctrl-C (SIGINT), Ctrl-\ (SIGQUIT):
    // each ends the wait at once, and the class goes with the run.
    for (signal, name) in [
        (Signal::TERM, "SIGTERM"),
        (Signal::HUP, "SIGHUP"),
        (Signal::INT, "SIGINT"),
        (Signal::QUIT, "SIGQUIT"),
    ] {
        let out = signalled(&kubeconfig, &api, signal).await;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(1), "{name}: {}", said(&out));
        assert!(
            text.contains(&format!("interrupted ({name}) before every verdict came")),
            "{name}: {text}"
        );
        assert!(
            api.get_opt(CLASS).await.expect("read").is_none(),
            "{name}: the class is deleted"
        );
    }

    // Control: SIGKILL cannot be caught, and the class stays behind, with its deadline: the
    // wait (60 s) and a minute more.
    let started = Timestamp::now();
    let out = signalled(&kubeconfig, &api, Signal::KILL).await;
    assert_eq!(out.status.code(), None, "killed: {}", said(&out));
    let left = api
        .get_opt(CLASS)
        .await
        .expect("read")
        .expect("the class is left behind");
    let deadline: Timestamp = left.metadata.annotations.as_ref().expect("annotations")
        [PREFLIGHT_DEADLINE_ANNOTATION]
        .parse()
        .expect("an RFC 3339 deadline");
    let life = deadline.duration_since(started).as_secs();
    assert!((119..=125).contains(&life), "the deadline is {life} s away");

    // Before its deadline it is a live run's class: the next run is refused, and leaves it.
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || preflight(&k, &["--timeout", "5s"]))
        .await
        .expect("join");
    let said_out = said(&out);
    assert_eq!(out.status.code(), Some(2), "{said_out}");
    assert!(said_out.contains("already exists"), "{said_out}");
    assert!(said_out.contains("stays live until"), "{said_out}");
    let still = api.get(CLASS).await.expect("the class stays");
    assert_eq!(still.metadata.uid, left.metadata.uid);

    // Its deadline passes (moved back, as the clock would move on): the next run replaces it
    // and passes, with the rows of its own class.
    api.patch(
        CLASS,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations":
            {PREFLIGHT_DEADLINE_ANNOTATION: "2020-01-01T00:00:00Z"}}})),
    )
    .await
    .expect("move the deadline");
    let agents = tokio::spawn(play_agents_replacing(
        client.clone(),
        NODES.iter().map(|n| healthy(n)).collect(),
        left.metadata.uid.clone(),
    ));
    let k = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || preflight(&k, &["--timeout", "20s"]))
        .await
        .expect("join");
    agents.await.expect("the agents");
    let said_out = said(&out);
    assert_eq!(out.status.code(), Some(0), "{said_out}");
    assert!(
        said_out.contains(
            "replacing PortMapClass kuport-preflight: preflight class kuport-preflight expired"
        ),
        "{said_out}"
    );
    assert!(
        api.get_opt(CLASS).await.expect("read").is_none(),
        "the replacement is deleted at the end"
    );
}

/// Against a real kube-apiserver, which enforces RBAC: the role docs/operations.md documents
/// lets the preflight read what it checks and create and delete its class, and nothing it does
/// is refused. (No agent Pods run here, so the agents check fails: exit 1, for that alone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_role_is_all_the_preflight_needs() {
    let Some(cp) =
        kuport_realapi::ControlPlane::start_or_skip("preflight_cli::rbac", Default::default())
            .await
    else {
        return;
    };
    cp.install_crds(Path::new(kuport_realapi::CRD_DIR))
        .await
        .expect("the CRDs install");
    let admin = cp.admin_client().await.expect("admin client");
    create(
        &Api::<Namespace>::all(admin.clone()),
        json!({"metadata": {"name": DAEMONSET_NAMESPACE,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}),
        "Namespace",
    )
    .await;
    for (i, n) in ["n1", "n2"].iter().enumerate() {
        let ip = format!("100.64.0.{}", i + 1);
        create(
            &Api::<Node>::all(admin.clone()),
            objects::node(n, Some(&ip), true),
            "Node",
        )
        .await;
    }
    create(
        &Api::<DaemonSet>::namespaced(admin.clone(), DAEMONSET_NAMESPACE),
        agent_daemonset(),
        "DaemonSet",
    )
    .await;
    create(
        &Api::<ServiceAccount>::namespaced(admin.clone(), DAEMONSET_NAMESPACE),
        json!({"metadata": {"name": "preflight"}}),
        "ServiceAccount",
    )
    .await;
    let docs = live::documented_rbac("preflight-rbac");
    live::bind(&admin, docs, DAEMONSET_NAMESPACE, "preflight").await;
    let token = cp
        .unbound_token(DAEMONSET_NAMESPACE, "preflight")
        .await
        .expect("a token");
    let kubeconfig = cp.kubeconfig().with_file_name("preflight.kubeconfig");
    cp.service_account_kubeconfig(DAEMONSET_NAMESPACE, "preflight", &token, &kubeconfig)
        .expect("the kubeconfig");

    let agents = vec![
        Agent {
            links: vec![("n2", true)],
            ..healthy("n1")
        },
        Agent {
            links: vec![("n1", true)],
            ..healthy("n2")
        },
    ];
    let (out, gone) = run(kubeconfig, admin, agents, &["--timeout", "20s"]).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(gone, "the class is deleted");
    assert!(
        text.contains("n1/n2") && text.contains("up    MTU 1370 verified"),
        "{text}"
    );
    let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("- ")).collect();
    assert_eq!(failed.len(), 1, "only the agents fail: {text}");
    assert!(failed[0].starts_with("- agents: "), "{text}");
    assert!(
        cp.forbidden_requests("system:serviceaccount:kuport-system:preflight")
            .expect("the audit log")
            .is_empty(),
        "the documented role covers every request"
    );
}
