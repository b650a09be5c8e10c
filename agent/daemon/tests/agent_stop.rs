//! The datapath outlives the API server and the agent, with three agents in one process
//! (`common`): an outage keeps it, a plain stop keeps it for the next agent (on both servers),
//! and only an uninstall (the DaemonSet gone) removes it, never an unreachable API server.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kuport::agent::StopPolicy;
use kuport_testkit::objects::{self, DAEMONSET_NAMESPACE, agent_daemonset, agent_pod};
use serde_json::Value;

use common::{Cluster, Target, dnat_targets, eventually, from, on_both_servers, programmed_true};

async fn a_plain_stop_keeps_the_datapath_and_a_resync_after_convergence_writes_nothing(
    target: Target,
) {
    let Some(mut c) = Cluster::start_on(
        target,
        "a_plain_stop_keeps_the_datapath_and_a_resync_after_convergence_writes_nothing",
        Duration::from_millis(300),
    )
    .await
    else {
        return;
    };
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    // Converged: wait until a full set of resync passes has run with no write at all.
    let writes = |c: &Cluster| -> u64 {
        c.agents
            .iter()
            .map(|a| a.metrics.status_writes_written())
            .sum()
    };
    let mut stable = (writes(&c), c.agent("n1").metrics.passes_ok());
    c.eventually("two resync passes in a row write nothing", || {
        let now = (writes(&c), c.agent("n1").metrics.passes_ok());
        let done = now.0 == stable.0 && now.1 >= stable.1 + 2;
        if now.0 != stable.0 {
            stable = now;
        }
        async move { done }
    })
    .await;

    let n1 = c.agent("n1").host.clone();
    let programmed = n1.applied();
    assert!(!programmed.nft.is_empty(), "programmed before shutdown");
    c.stop_all().await;
    assert_eq!(n1.lock().teardowns, 0, "a plain stop keeps the datapath");
    assert_eq!(n1.applied(), programmed, "for the next agent to adopt");
    for a in &c.agents {
        assert!(!a.health.is_alive(), "{} stopped", a.name);
    }
}

on_both_servers!(a_plain_stop_keeps_the_datapath_and_a_resync_after_convergence_writes_nothing);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_keeps_the_datapath_and_converges_after() {
    let mut c = Cluster::start_with(Duration::from_millis(300)).await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    c.eventually("the pod node delivers to the pod", || async {
        dnat_targets(&c.agent("n2").host).contains(&"10.244.2.5".to_owned())
    })
    .await;
    let failed_before = c.agent("n1").metrics.passes_failed();
    let (n1_nft, n2_state) = (
        c.agent("n1").host.applied().nft,
        c.agent("n2").host.applied(),
    );
    c.model().faults().pause();
    // A host change during the outage: the next resync pass wants to write n1's row and cannot.
    c.agent("n1").host.lock().facts.underlay_mtu = Some(1400);
    c.eventually("a pass fails on the unreachable API server", || async {
        c.agent("n1").metrics.passes_failed() > failed_before
    })
    .await;
    for a in &c.agents {
        assert_eq!(a.host.lock().teardowns, 0, "{}: nothing torn down", a.name);
    }
    // n1 re-applied its link with the new MTU; its rules, and all of n2, are untouched.
    assert_eq!(
        c.agent("n1").host.applied().nft,
        n1_nft,
        "the mapping keeps being served during the outage"
    );
    assert_eq!(
        c.agent("n2").host.applied(),
        n2_state,
        "the pod node keeps its half"
    );
    c.model().faults().resume();
    c.eventually("the row reports the new MTU after the outage", || async {
        c.class().await.status.is_some_and(|s| {
            s.nodes
                .iter()
                .any(|n| n.name == "n1" && n.underlay_mtu == Some(1400))
        })
    })
    .await;
    assert_eq!(c.agent("n1").host.lock().teardowns, 0);
    c.stop_all().await;
}

/// The DaemonSet `kuport-system/kuport-agent` and one Pod of it per node, as the cluster's
/// controllers would have made them; returns the DaemonSet's uid.
async fn install_daemonset(c: &Cluster) -> String {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Pod;
    let pp = PostParams::default();
    Api::<Namespace>::all(c.client.clone())
        .create(
            &pp,
            &from(objects::namespace(DAEMONSET_NAMESPACE, Value::Null)),
        )
        .await
        .expect("namespace");
    let ds: DaemonSet = Api::namespaced(c.client.clone(), DAEMONSET_NAMESPACE)
        .create(&pp, &from(agent_daemonset()))
        .await
        .expect("daemonset");
    let uid = ds.metadata.uid.expect("the model assigns a uid");
    for i in 1..=3 {
        Api::<Pod>::namespaced(c.client.clone(), DAEMONSET_NAMESPACE)
            .create(&pp, &from(agent_pod(&format!("n{i}"), &uid)))
            .await
            .expect("pod");
    }
    uid
}

fn owner_policy(i: usize) -> StopPolicy {
    StopPolicy::Owner {
        pod: format!("kuport-agent-n{i}"),
        namespace: "kuport-system".into(),
    }
}

/// Restarting agents (a rollout) keeps every node's datapath and the new agent adopts it;
/// deleting the DaemonSet (an uninstall) makes the stopping agent remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_tears_down_only_when_its_daemonset_is_gone() {
    let mut c = Cluster::start().await;
    install_daemonset(&c).await;
    // Replace the three agents with ones that know their Pod, on the same hosts.
    let resync = Duration::from_secs(3600);
    for i in 1..=3 {
        let host = c.stop(&format!("n{i}")).await;
        c.start_agent_on(i, host, resync, None, owner_policy(i));
    }
    eventually("Programmed=True", || programmed_true(&c)).await;
    let n1 = c.agent("n1").host.clone();
    eventually("n1 programs the mapping", || async {
        !dnat_targets(&n1).is_empty()
    })
    .await;

    // A rollout: n1's agent stops while its DaemonSet stands, and a new one takes over.
    let programmed = n1.applied();
    let host = c.stop("n1").await;
    assert_eq!(host.lock().teardowns, 0, "an update keeps the datapath");
    assert_eq!(host.applied(), programmed);
    c.start_agent_on(1, host, resync, None, owner_policy(1));
    eventually("the new n1 agent is ready", || async {
        c.agent("n1").health.is_ready()
    })
    .await;
    assert_eq!(n1.lock().teardowns, 0);
    assert_eq!(
        n1.applied(),
        programmed,
        "the new agent adopted the same datapath"
    );

    // An uninstall: the DaemonSet is deleted, then its pods stop.
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(c.client.clone(), "kuport-system")
        .delete("kuport-agent", &Default::default())
        .await
        .expect("delete daemonset");
    for name in ["n1", "n2", "n3"] {
        let host = c.stop(name).await;
        assert_eq!(host.lock().teardowns, 1, "{name} removes the datapath");
        assert_eq!(host.applied(), Default::default(), "{name} is clean");
    }
}

/// An agent that cannot reach the API server at stop keeps the datapath, even when it knows its
/// Pod: an outage is never a reason to remove anything. (A removal its watches saw before the
/// outage is: `lifecycle.rs` tests that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_at_stop_keeps_the_datapath() {
    let mut c = Cluster::start().await;
    install_daemonset(&c).await;
    let host = c.stop("n1").await;
    c.start_agent_on(1, host, Duration::from_secs(3600), None, owner_policy(1));
    eventually("n1 programs the mapping", || async {
        !dnat_targets(&c.agent("n1").host).is_empty()
    })
    .await;
    c.model().faults().pause();
    let host = c.stop("n1").await;
    c.model().faults().resume();
    assert_eq!(host.lock().teardowns, 0, "no answer, no teardown");
    assert!(!dnat_targets(&host).is_empty());
    c.stop_all().await;
}
