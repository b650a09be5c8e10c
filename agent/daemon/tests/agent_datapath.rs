//! What each node programs, with three agents in one process (`common`): the serving node, the
//! pod's node and a bystander; links claimed concurrently; a mapping the kernel refuses and a
//! failed conntrack sweep, each kept to itself. The first scenario runs on both servers, and
//! its control proves the RBAC check: a missing verb fails it with the apiserver's 403.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use kuport::agent::{StopPolicy, WriteKind, WriteResult};
use kuport_core::api::PortMap;
use kuport_host::MemoryHost;
use kuport_sim::apiserver::{Failure, RequestFilter};
use kuport_testkit::cluster::agent_host_facts;
use kuport_testkit::objects::{endpoint, pm, slice};
use serde_json::json;

use common::{
    Cluster, Target, dnat_targets, dnats, from, on_both_servers, programmed_true, settle,
};

async fn remote_pod_gets_a_link_and_is_programmed_by_the_right_node(target: Target) {
    let Some(mut c) = Cluster::start_on(
        target,
        "remote_pod_gets_a_link_and_is_programmed_by_the_right_node",
        Duration::from_secs(3600),
    )
    .await
    else {
        return;
    };
    c.eventually("Accepted=True", || async {
        c.condition("Accepted")
            .await
            .is_some_and(|(s, _)| s == "True")
    })
    .await;
    c.eventually("the pod node's link claim lands", || async {
        c.class()
            .await
            .status
            .is_some_and(|s| s.links.iter().any(|l| l.key == "n1/n2"))
    })
    .await;
    // The serving node DNATs toward the pod node's end of the link; the pod node DNATs on
    // to the pod.
    c.eventually(
        "the serving node programs the DNAT over the link",
        || async {
            let n1 = c.agent("n1").host.applied();
            n1.links.len() == 1
                && dnat_targets(&c.agent("n1").host) == [n1.links[0].peer_address.to_string()]
        },
    )
    .await;
    c.eventually("the pod node delivers to the pod", || async {
        dnat_targets(&c.agent("n2").host).contains(&"10.244.2.5".to_owned())
    })
    .await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    // The link exists at both ends, and the bystander programs nothing.
    assert_eq!(c.agent("n2").host.applied().links.len(), 1);
    assert_eq!(c.agent("n3").host.applied(), Default::default());
    // The serving node is the only PortMap status writer; n3 writes nothing at all.
    for (node, writes) in [("n2", 0), ("n3", 0)] {
        assert_eq!(
            c.agent(node)
                .metrics
                .status_writes_of(WriteKind::PortMap, WriteResult::Written),
            writes,
            "{node} must not write the PortMap status"
        );
    }
    assert!(
        c.agent("n1")
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Written)
            > 0
    );
    assert_eq!(c.agent("n3").metrics.status_writes_written(), 0);
    // n1's accepting row, and n2's row of link ends only: n2 is not an accepting node, but
    // acknowledges its end of the link at its slot.
    type Row = (String, Option<bool>, Vec<(String, i32)>);
    let rows: Vec<Row> = c
        .class()
        .await
        .status
        .map(|s| {
            s.nodes
                .into_iter()
                .map(|n| {
                    let ends = n.links.into_iter().map(|l| (l.peer, l.slot)).collect();
                    (n.name, n.accepting, ends)
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        rows,
        [
            ("n1".to_owned(), None, vec![("n2".to_owned(), 0)]),
            ("n2".to_owned(), Some(false), vec![("n1".to_owned(), 0)]),
        ]
    );

    // The pod moves to the serving node itself: the link goes, the DNAT follows.
    c.set_endpoint(Some(1), false).await;
    c.eventually("the DNAT follows the pod", || async {
        dnat_targets(&c.agent("n1").host) == ["10.244.1.5"]
    })
    .await;
    c.eventually("the old link is gone on both ends", || async {
        c.agent("n1").host.applied().links.is_empty()
            && c.agent("n2").host.applied().links.is_empty()
    })
    .await;
    c.eventually("n2, holding no link any more, removes its row", || async {
        c.class()
            .await
            .status
            .is_some_and(|s| s.nodes.iter().all(|n| n.name != "n2"))
    })
    .await;
    c.eventually("the status names the new endpoint", || async {
        c.portmap()
            .await
            .status
            .and_then(|s| s.endpoint)
            .is_some_and(|e| e.node == "n1")
    })
    .await;
    c.eventually("the unused claim is marked for collection", || async {
        c.class().await.status.is_some_and(|s| {
            s.links
                .iter()
                .any(|l| l.key == "n1/n2" && l.unused_since.is_some())
        })
    })
    .await;
    c.stop_all().await;
}

on_both_servers!(remote_pod_gets_a_link_and_is_programmed_by_the_right_node);

/// The control for the RBAC check: the first scenario, under the shipped role less `update` on
/// `portmaps/status`, fails with the apiserver's 403 naming that verb and resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_rbac_control_a_missing_verb_fails_with_a_403_naming_it() {
    let test = "real_rbac_control_a_missing_verb_fails_with_a_403_naming_it";
    if !kuport_realapi::available_or_skip(test) {
        return;
    }
    let role = kuport_realapi::without_verb(
        kuport_realapi::agent_role().expect("the agent's ClusterRole"),
        "portmaps/status",
        "update",
    );
    let scenario = tokio::spawn(remote_pod_gets_a_link_and_is_programmed_by_the_right_node(
        Target::Real(Box::new(role)),
    ));
    let failure = scenario
        .await
        .expect_err("the scenario must fail without update on portmaps/status");
    let payload = failure.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    assert!(
        message.contains("the agent's ClusterRole refused")
            && message.contains("update portmaps/status games/game")
            && message.contains("cannot update resource \"portmaps/status\""),
        "the failure does not name the missing verb: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pod_nodes_claim_links_concurrently_and_get_distinct_slots() {
    let mut c = Cluster::start().await;
    c.eventually("first link lands", || async {
        c.class()
            .await
            .status
            .is_some_and(|s| s.links.iter().any(|l| l.key == "n1/n2"))
    })
    .await;
    // A second mapping whose pod is on n3, plus a conflict storm on class status writes.
    c.model().faults().fail_next(
        6,
        Failure::Conflict,
        RequestFilter::writes().resource("portmapclasses").status(),
    );
    let pp = PostParams::default();
    common::put_pod(&c.client, "games", "voice-0", "n3", "10.244.3.7").await;
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), "games");
    slices
        .create(
            &pp,
            &from(
                slice("games", "voice-abc", "voice")
                    .port("voice", "UDP", 4000)
                    .endpoint(endpoint("10.244.3.7", "n3").ready(true))
                    .object(),
            ),
        )
        .await
        .expect("slice");
    Api::<PortMap>::namespaced(c.client.clone(), "games")
        .create(
            &pp,
            &from(
                pm("games", "voice", "public", 4000)
                    .service("voice", "voice")
                    .object(),
            ),
        )
        .await
        .expect("portmap");
    c.eventually("both claims land on distinct slots", || async {
        c.class().await.status.is_some_and(|s| {
            let slots: Vec<i32> = s.links.iter().map(|l| l.slot).collect();
            s.links.len() == 2 && slots[0] != slots[1]
        })
    })
    .await;
    c.eventually("the serving node holds both links", || async {
        c.agent("n1").host.applied().links.len() == 2
    })
    .await;
    assert!(c.model().faults().injected() >= 1, "the storm was injected");
    c.stop_all().await;
}

/// The kernel of the pod's node refuses one mapping's rules: that mapping says so in status
/// (Programmed=False, HostRefused, the kernel's words, the node named), the class lists the
/// refusal under that node, and every other mapping on the node is programmed and written.
/// When the kernel takes the rules again, the mapping is programmed and the entry goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_mapping_is_reported_and_the_others_keep_working() {
    let mut c = Cluster::empty_on(Target::Model, "refusal")
        .await
        .expect("model");
    c.seed().await;
    c.create_portmap("other", 3001).await;
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    let n2 = MemoryHost::with_facts(agent_host_facts(2));
    n2.lock().refuse.insert(
        "games/game".into(),
        "Could not process rule: Operation not supported".into(),
    );
    let hour = Duration::from_secs(3600);
    c.start_agent(1, hour);
    c.start_agent_on(2, n2.clone(), hour, None, StopPolicy::Keep);
    c.start_agent(3, hour);

    let programmed = |name: &'static str| {
        let api = portmaps.clone();
        async move {
            api.get(name).await.ok().and_then(|pm| {
                pm.status?
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "Programmed")
                    .map(|c| (c.status, c.reason, c.message))
            })
        }
    };
    c.eventually("the other mapping is programmed", || async {
        programmed("other")
            .await
            .is_some_and(|(s, _, _)| s == "True")
    })
    .await;
    c.eventually("the refused mapping says why", || async {
        programmed("game").await.is_some_and(|(s, r, m)| {
            s == "False"
                && r == "HostRefused"
                && m == "on node n2, the kernel refused its nftables rules: Could not process rule: Operation not supported"
        })
    })
    .await;
    let refused = c.class().await.status.expect("status").refused;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(
        (refused[0].node.as_str(), refused[0].mapping.as_str()),
        ("n2", "games/game")
    );
    // n2 delivers the other mapping to the pod and nothing of the refused one.
    let comments: Vec<String> = dnats(&n2)
        .into_iter()
        .map(|d| d.comment.to_string())
        .collect();
    assert_eq!(comments, ["games/other"]);
    assert_eq!(
        c.agent("n2")
            .metrics
            .encode()
            .expect("metrics")
            .lines()
            .find(|l| l.starts_with("kuport_host_refusals ")),
        Some("kuport_host_refusals 1")
    );

    // The kernel takes the rules again: the agent retries on its own (no watch event needed).
    n2.lock().refuse.clear();
    c.eventually(
        "the mapping is programmed once the kernel takes it",
        || async {
            programmed("game")
                .await
                .is_some_and(|(s, _, _)| s == "True")
        },
    )
    .await;
    c.eventually("the class entry is gone", || async {
        c.class().await.status.is_some_and(|s| s.refused.is_empty())
    })
    .await;
    c.stop_all().await;
}

/// The host's sweeps of stale conntrack entries run off the pass (the host retries a failed
/// one itself): each outcome the host reports is counted as it comes, and a failed one fails
/// no pass. (The memory host scripts what the kernel's table would say, one per apply.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conntrack_sweeps_are_counted_as_the_host_reports_them_and_fail_no_pass() {
    use kube::api::{Patch, PatchParams};
    let mut c = Cluster::empty_on(Target::Model, "conntrack")
        .await
        .expect("model");
    c.seed().await;
    let n1 = MemoryHost::with_facts(agent_host_facts(1));
    let hour = Duration::from_secs(3600);
    c.start_agent_on(1, n1.clone(), hour, None, StopPolicy::Keep);
    c.start_agent(2, hour);
    c.start_agent(3, hour);
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    settle(&c).await;

    n1.lock().conntrack_sweeps.extend([
        Err("listing the conntrack table: Operation not permitted".to_owned()),
        Ok(2),
    ]);
    let metrics = c.agent("n1").metrics.clone();
    let series = |line: &str| {
        metrics
            .encode()
            .expect("metrics")
            .lines()
            .any(|l| l == line)
    };
    // A change every pass reads and that changes no plan: one pass on each node, one sweep
    // reported by n1's host per pass.
    for value in ["once", "twice"] {
        Api::<Namespace>::all(c.client.clone())
            .patch(
                "games",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"touched": value}}})),
            )
            .await
            .expect("namespace labelled");
        c.eventually("the sweep is counted", || {
            std::future::ready(series(&format!(
                "kuport_conntrack_sweeps_total{{result=\"{}\"}} 1",
                if value == "once" { "failed" } else { "ok" }
            )))
        })
        .await;
    }
    assert!(series("kuport_conntrack_sweeps_total{result=\"failed\"} 1"));
    assert!(series("kuport_conntrack_entries_cleared_total 2"));
    assert_eq!(metrics.passes_failed(), 0, "a failed sweep fails no pass");
    assert!(n1.lock().conntrack_sweeps.is_empty());
    c.stop_all().await;
}
