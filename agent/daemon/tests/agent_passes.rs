//! What starts a pass, with three agents in one process (`common`): a link event, or a rule
//! removed by another program, rebuilds the datapath at once (on both servers), watch events
//! changing nothing a pass reads run none, cilium-config is watched rather than read per
//! pass, and a preflight class's deadline starts one by itself.

mod common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kuport::agent::HostWatch;
use kuport_core::api::{PortMap, PortMapClass};
use kuport_host::{HostEvent, HostEventKind};
use serde_json::json;

use common::{
    Cluster, Target, dnat_targets, from, on_both_servers, passes, programmed_true, settle,
};

async fn a_link_event_rebuilds_the_datapath_at_once(target: Target) {
    let Some(mut c) = Cluster::empty_on(target, "a_link_event_rebuilds_the_datapath_at_once").await
    else {
        return;
    };
    c.seed().await;
    // The pod node's link events come from the test; the agent asks for the underlay device.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut rx = Some(rx);
    let seen = asked.clone();
    let watch: HostWatch = Box::new(move |devices| {
        seen.lock().expect("lock").push(devices);
        rx.take().ok_or(kuport_host::HostError::Missing {
            stage: kuport_host::HostStage::Links,
            what: "a second link event stream".into(),
        })
    });
    c.start_agent(1, Duration::from_secs(3600));
    c.start_agent_with(2, Duration::from_secs(3600), Some(watch));
    c.start_agent(3, Duration::from_secs(3600));
    c.eventually("the pod node programs its half", || async {
        c.agent("n2").host.applied().links.len() == 1
    })
    .await;
    assert_eq!(
        asked.lock().expect("lock").first(),
        Some(&vec!["wg0".to_owned()])
    );
    let programmed = c.agent("n2").host.applied();
    // A restarted mesh daemon deletes every link bound to its device.
    c.agent("n2").host.lock().applied = Default::default();
    let link = programmed.links[0].name.clone();
    tx.send(HostEvent::link(link, true))
        .await
        .expect("event sent");
    // No watch event and no resync is due: only the link event can cause this pass.
    c.eventually("the link and rules are rebuilt", || async {
        c.agent("n2").host.applied() == programmed
    })
    .await;

    // Another program deletes kuport's ip rules: the host announces it, and the pass it starts
    // compares with the kernel and puts them back.
    settle(&c).await;
    c.agent("n2").host.lock().applied.rules.clear();
    tx.send(HostEvent {
        kind: HostEventKind::Rule,
        what: "ip rule pref 102 fwmark 0x2/0xff lookup 1802502146".into(),
        removed: true,
    })
    .await
    .expect("event sent");
    c.eventually("the rules are put back", || async {
        c.agent("n2").host.applied() == programmed
    })
    .await;
    assert_eq!(
        c.agent("n2").metrics.host_events(HostEventKind::Rule),
        1,
        "counted"
    );
    // The repair is one pass, not a storm: the agents come to rest.
    settle(&c).await;
    c.stop_all().await;
}

on_both_servers!(a_link_event_rebuilds_the_datapath_at_once);

/// A watch event changing nothing a pass reads runs no pass: a row's pass time refreshed, a
/// kubelet's heartbeat, and on the nodes that do not write it a PortMap's status written over.
/// The node that writes that status puts its own back, and its own write coming back runs no
/// pass either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_changing_nothing_a_pass_reads_run_no_pass() {
    let mut c = Cluster::start().await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    c.eventually("the pod node delivers to the pod", || async {
        dnat_targets(&c.agent("n2").host).contains(&"10.244.2.5".to_owned())
    })
    .await;
    settle(&c).await;
    let before: Vec<u64> = c.agents.iter().map(passes).collect();
    let ignored = |kind: &str| -> Vec<u64> {
        c.agents
            .iter()
            .map(|a| a.metrics.watch_events(kind, false))
            .collect()
    };
    let ignored_before: Vec<Vec<u64>> = ["PortMapClass", "Node", "PortMap"]
        .into_iter()
        .map(ignored)
        .collect();
    let pp = PostParams::default();

    // Every row's pass time moved, as each agent refreshes it once a minute (half a minute
    // ago: another time than the one stored, and recent enough for n1 to keep it).
    let classes: Api<PortMapClass> = Api::all(c.client.clone());
    let mut class = c.class().await;
    let recently = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(30))
        .expect("a time");
    for row in class.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
        row.last_pass_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            recently,
        ));
    }
    classes
        .replace_status("public", &pp, &class)
        .await
        .expect("class status written");
    // A kubelet's heartbeat on n3.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let mut n3 = nodes.get_status("n3").await.expect("node n3");
    for cond in n3
        .status
        .iter_mut()
        .flat_map(|s| s.conditions.iter_mut().flatten())
    {
        cond.last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    }
    nodes
        .replace_status("n3", &pp, &n3)
        .await
        .expect("node status written");
    // The PortMap's status written over by someone other than its writer, n1.
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let mut game = c.portmap().await;
    let message = |pm: &PortMap| -> Option<String> {
        pm.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == "Programmed")
            .map(|c| c.message.clone())
    };
    let programmed = message(&game);
    for cond in game.status.iter_mut().flat_map(|s| s.conditions.iter_mut()) {
        cond.message = "written by hand".into();
    }
    portmaps
        .replace_status("game", &pp, &game)
        .await
        .expect("portmap status written");

    c.eventually("n1 puts its status back", || async {
        message(&c.portmap().await) == programmed
    })
    .await;
    // Every agent has seen every one of those events (and n2 and n3 the status put back).
    c.eventually("every agent ignored the events", || async {
        let now: Vec<Vec<u64>> = ["PortMapClass", "Node", "PortMap"]
            .into_iter()
            .map(ignored)
            .collect();
        (0..c.agents.len()).all(|i| {
            let portmap_events = if c.agents[i].name == "n1" { 1 } else { 2 };
            now[0][i] > ignored_before[0][i]
                && now[1][i] > ignored_before[1][i]
                && now[2][i] >= ignored_before[2][i] + portmap_events
        })
    })
    .await;
    for (a, before) in c.agents.iter().zip(&before) {
        if a.name == "n1" {
            assert!(passes(a) > *before, "n1 ran a pass to put its status back");
        } else {
            assert_eq!(passes(a), *before, "{} ran a pass", a.name);
        }
    }
    c.stop_all().await;
}

/// cilium-config is watched, not read per pass: creating it after the agents started refuses a
/// mapping on the CNI's overlay port, and deleting it takes the refusal back, with no other
/// object changing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cni_config_is_watched() {
    let mut c = Cluster::empty_on(Target::Model, "cni-watch")
        .await
        .expect("model");
    c.seed().await;
    c.start_agents_until_programmed().await;
    let configs: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(c.client.clone(), "kube-system");
    configs
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "cilium-config"},
                         "data": {"routing-mode": "tunnel", "tunnel-port": "3000"}})),
        )
        .await
        .expect("cilium-config");
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let accepted = || async {
        portmaps.get("game").await.ok().and_then(|pm| {
            pm.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Accepted")
                .map(|c| (c.status, c.reason))
        })
    };
    c.eventually("the overlay port is refused", || async {
        accepted().await == Some(("False".into(), "PortInUse".into()))
    })
    .await;
    configs
        .delete("cilium-config", &Default::default())
        .await
        .expect("delete");
    c.eventually("accepted again once the CNI config is gone", || async {
        accepted().await.is_some_and(|(s, _)| s == "True")
    })
    .await;
    c.stop_all().await;
}

/// A Pod on `node` in `games`, Ready or not (the agent watches its own node's Pods).
fn pod_on(node: &str, name: &str, ready: bool) -> k8s_openapi::api::core::v1::Pod {
    from(json!({
        "metadata": {"name": name, "namespace": "games"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "lobby"}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    }))
}

/// A slice of the Service `games/lobby`, which no PortMap refers to, its endpoint `ready`.
fn lobby_slice(ready: bool) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    from(
        kuport_testkit::objects::slice("games", "lobby-0", "lobby")
            .port("game", "UDP", 3000)
            .endpoint(
                kuport_testkit::objects::endpoint("10.244.2.9", "n2")
                    .pod("games", "lobby-0")
                    .ready(ready),
            )
            .object(),
    )
}

/// The busy-cluster measure of `docs/performance.md`: 1,000 changes elsewhere in the cluster
/// that concern no mapping (a Service's EndpointSlice no PortMap refers to: created, its
/// endpoint's readiness flipped, deleted; a Pod's readiness flipped; a PortMap's annotations)
/// run at most 10 passes on any node, and the first change to the mapping's own slice runs one
/// on every node (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_changes_to_no_mapping_run_almost_no_pass() {
    let mut c = Cluster::start().await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    let pp = PostParams::default();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), "games");
    pods.create(&pp, &pod_on("n2", "lobby-0", true))
        .await
        .expect("pod");
    settle(&c).await;
    let before: Vec<u64> = c.agents.iter().map(passes).collect();
    let seen = |kind: &str| -> Vec<u64> {
        c.agents
            .iter()
            .map(|a| a.metrics.watch_events(kind, false) + a.metrics.watch_events(kind, true))
            .collect()
    };
    let seen_before: Vec<Vec<u64>> = ["EndpointSlice", "Pod", "PortMap"]
        .into_iter()
        .map(seen)
        .collect();
    let marked = |a: &common::RunningAgent| -> u64 {
        ["EndpointSlice", "Pod", "PortMap"]
            .iter()
            .map(|k| a.metrics.watch_events(k, true))
            .sum()
    };
    let marked_before: Vec<u64> = c.agents.iter().map(marked).collect();

    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(c.client.clone(), "games");
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let mut changes = 0;
    slices.create(&pp, &lobby_slice(true)).await.expect("slice");
    changes += 1;
    for i in 0..332 {
        let mut slice = slices.get("lobby-0").await.expect("slice");
        slice.endpoints = lobby_slice(i % 2 == 1).endpoints;
        slices.replace("lobby-0", &pp, &slice).await.expect("slice");
        changes += 1;
    }
    slices
        .delete("lobby-0", &Default::default())
        .await
        .expect("slice deleted");
    changes += 1;
    for i in 0..333 {
        let mut pod = pods.get_status("lobby-0").await.expect("pod");
        pod.status = pod_on("n2", "lobby-0", i % 2 == 1).status;
        pods.replace_status("lobby-0", &pp, &pod)
            .await
            .expect("pod status");
        changes += 1;
    }
    for i in 0..333 {
        let mut game = portmaps.get("game").await.expect("portmap");
        game.metadata.annotations = Some([("team/last-deploy".to_owned(), format!("{i}"))].into());
        portmaps.replace("game", &pp, &game).await.expect("portmap");
        changes += 1;
    }
    assert_eq!(changes, 1000);
    // Every agent saw them all (the Pod only on its node) before anything is counted.
    c.eventually("every agent saw every change", || {
        let now: Vec<Vec<u64>> = ["EndpointSlice", "Pod", "PortMap"]
            .into_iter()
            .map(seen)
            .collect();
        let done = (0..c.agents.len()).all(|i| {
            let pod_events = if c.agents[i].name == "n2" { 333 } else { 0 };
            now[0][i] >= seen_before[0][i] + 334
                && now[1][i] >= seen_before[1][i] + pod_events
                && now[2][i] >= seen_before[2][i] + 333
        });
        std::future::ready(done)
    })
    .await;
    settle(&c).await;
    // Events that marked a node dirty: each would run a pass of its own when changes come
    // further apart than the debounce (here they come faster, and a burst makes one pass).
    let ran: Vec<(String, u64, u64)> = (0..c.agents.len())
        .map(|i| {
            let a = &c.agents[i];
            (
                a.name.clone(),
                marked(a) - marked_before[i],
                passes(a) - before[i],
            )
        })
        .collect();
    eprintln!(
        "over {changes} changes to no mapping, per node (events marking it dirty, passes): {ran:?}"
    );
    for (node, dirty, ran) in &ran {
        assert!(
            *dirty <= 10 && *ran <= 10,
            "{node}: {dirty} events marked it dirty, {ran} passes ran, over {changes} unrelated changes"
        );
    }

    // Control: the mapping's own endpoint moving runs a pass on every node.
    let before: Vec<u64> = c.agents.iter().map(passes).collect();
    c.set_endpoint(Some(3), false).await;
    c.eventually("every node passes for the mapping's slice", || {
        let all = c.agents.iter().zip(&before).all(|(a, b)| passes(a) > *b);
        std::future::ready(all)
    })
    .await;
    c.stop_all().await;
}

/// A preflight class left behind (its `kuport preflight` killed) ends at its deadline with no
/// object changing: every agent passes then by itself (the resync is an hour away) and takes
/// its links down. The agents' clocks run 55 s ahead of the system's, so the deadline plus the
/// minute allowed for clock skew comes a few seconds into the test, after the links were built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preflight_class_ends_at_its_deadline_without_any_event() {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use kuport::agent::Clock;
    use kuport_core::api::{PREFLIGHT_ANNOTATION, PREFLIGHT_DEADLINE_ANNOTATION};

    const CLASS: &str = "kuport-preflight";
    let server = kuport_sim::apiserver::ApiServer::builder()
        .build()
        .expect("model builds");
    let mut c = common::Cluster::on_model(server).await;
    c.seed().await;
    let ahead = SignedDuration::from_secs(55);
    c.clock = Some(Clock::from_fn(move || Timestamp::now() + ahead));
    // The agents drop it once their clocks pass the deadline plus 60 s: 13 s from now.
    let deadline = Timestamp::now() + SignedDuration::from_secs(8);
    let ends = std::time::Instant::now() + Duration::from_secs(13);
    let class: PortMapClass = from(json!({
        "apiVersion": "kuport.wlz.li/v1alpha1", "kind": "PortMapClass",
        "metadata": {"name": CLASS, "annotations": {
            PREFLIGHT_ANNOTATION: "true",
            PREFLIGHT_DEADLINE_ANNOTATION: deadline.to_string()}},
        "spec": {
            "nodes": {"n1": {"interfaces": ["eth0"]}, "n2": {"interfaces": ["eth0"]},
                      "n3": {"interfaces": ["eth0"]}},
            "ports": {"min": 1, "max": 1, "reserved": [1], "systemReserved": []},
            "returnPath": {"mode": "Vxlan",
                "vxlan": {"port": 4790, "subnet": "169.254.112.0/20", "vni": 60000}}},
    }));
    let classes: Api<PortMapClass> = Api::all(c.client.clone());
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("the preflight class");
    for i in 1..=3 {
        c.start_agent(i, Duration::from_secs(3600));
    }
    let preflight_links = |name: &str| {
        c.agent(name)
            .host
            .applied()
            .links
            .iter()
            .filter(|l| l.class == CLASS)
            .count()
    };
    c.eventually("every node links to both others", || async {
        ["n1", "n2", "n3"].iter().all(|n| preflight_links(n) == 2)
    })
    .await;
    assert!(
        std::time::Instant::now() < ends,
        "the links were up before the deadline (else the test proves nothing)"
    );
    let passes_before: Vec<u64> = c.agents.iter().map(passes).collect();
    c.eventually("every node takes its links down", || async {
        ["n1", "n2", "n3"].iter().all(|n| preflight_links(n) == 0)
    })
    .await;
    assert!(
        std::time::Instant::now() >= ends - Duration::from_millis(500),
        "not before the deadline and the skew allowance"
    );
    // A pass is counted once its apply is done: under load the count can trail the host's
    // state for a moment.
    c.eventually("each agent passed by itself", || {
        let passes_after: Vec<u64> = c.agents.iter().map(passes).collect();
        std::future::ready(passes_after.iter().zip(&passes_before).all(|(a, b)| a > b))
    })
    .await;
    c.eventually("the class says it expired", || async {
        let class = classes.get(CLASS).await.expect("the class");
        class
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .any(|cond| cond.type_ == "Ready" && cond.reason == "PreflightExpired")
    })
    .await;
    c.stop_all().await;
}
