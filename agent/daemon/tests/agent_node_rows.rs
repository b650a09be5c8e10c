//! Agents run with `--rows-in node`: each writes its rows of the classes into its own
//! `PortMapNode` rather than into the class statuses, and every agent (and `kuport status`)
//! reads them from there. An agent moving its rows there removes the row it left in the class,
//! so a rollout from `class` to `node` leaves the class status without rows, with the mapping
//! programmed throughout.

mod common;

use std::time::Duration;

use kube::api::Api;
use kuport::agent::{RowsIn, StopPolicy, WriteKind, WriteResult};
use kuport_core::api::{PortMapClass, PortMapNode};
use kuport_sim::apiserver::{ApiServer, Failure, RequestFilter};

use common::{Cluster, poke_every_agent, programmed_true, row_mtu, settle};

/// The seeded cluster with agents n1..n3 writing their rows into their own objects.
async fn node_mode_cluster() -> Cluster {
    let server = ApiServer::builder().build().expect("model builds");
    let mut c = Cluster::on_model(server).await;
    c.rows_in = RowsIn::Node;
    c.seed().await;
    for i in 1..=3 {
        c.start_agent(i, Duration::from_secs(3600));
    }
    c
}

/// The class as stored, rows and all (not the rows that count, which `Cluster::class` gives).
async fn stored_class(c: &Cluster) -> PortMapClass {
    Api::<PortMapClass>::all(c.client.clone())
        .get("public")
        .await
        .expect("class")
}

/// The rows `node`'s own object holds, by class.
async fn own_rows(c: &Cluster, node: &str) -> Vec<(String, Option<bool>, Vec<String>)> {
    let object = Api::<PortMapNode>::all(c.client.clone())
        .get_opt(node)
        .await
        .expect("read PortMapNode");
    object
        .into_iter()
        .flat_map(|o| o.spec.classes)
        .map(|entry| {
            let peers = entry.row.links.iter().map(|l| l.peer.clone()).collect();
            (entry.class, entry.row.accepting, peers)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_live_in_each_nodes_own_object_and_move_there_on_upgrade() {
    // First every agent writes its rows into the class, as agents before PortMapNode did.
    let server = ApiServer::builder().build().expect("model builds");
    let mut c = Cluster::on_model(server).await;
    c.seed().await;
    for i in 1..=3 {
        c.start_agent(i, Duration::from_secs(3600));
    }
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    c.eventually("n1 and n2 write rows into the class", || async {
        let class = stored_class(&c).await;
        let names: Vec<String> = class
            .status
            .iter()
            .flat_map(|s| s.nodes.iter().map(|r| r.name.clone()))
            .collect();
        names == ["n1", "n2"]
    })
    .await;
    assert!(
        own_rows(&c, "n1").await.is_empty(),
        "no object in class mode"
    );

    // The rollout: each agent restarts with --rows-in node, one after the other.
    c.rows_in = RowsIn::Node;
    for i in 1..=3 {
        let name = format!("n{i}");
        let host = c.stop(&name).await;
        c.start_agent_on(i, host, Duration::from_secs(3600), None, StopPolicy::Keep);
        c.eventually("Programmed=True after the restart", || programmed_true(&c))
            .await;
    }
    c.eventually("every row moved to its node's own object", || async {
        let class = stored_class(&c).await;
        let left_in_class = class.status.as_ref().map_or(0, |s| s.nodes.len());
        let n1 = own_rows(&c, "n1").await;
        let n2 = own_rows(&c, "n2").await;
        left_in_class == 0
            && n1 == [("public".to_owned(), None, vec!["n2".to_owned()])]
            && n2 == [("public".to_owned(), Some(false), vec!["n1".to_owned()])]
    })
    .await;
    // The bystander has no row, and so no object.
    assert!(own_rows(&c, "n3").await.is_empty());
    // The class's summary is computed from the objects' rows.
    let class = stored_class(&c).await;
    let ready: Vec<String> = class.status.map(|s| s.ready_nodes).unwrap_or_default();
    assert_eq!(ready, ["n1"]);
    assert!(programmed_true(&c).await);
    c.stop_all().await;
}

/// The same write of a node's own `PortMapNode` answered two ways, as kube-apiserver answers
/// them (`refusal.rs`): a refusal (an admission policy's 422) is counted with its reason, fails
/// the pass and is not written again before the pass's retry, one write a pass; a conflict
/// (someone else wrote the object meanwhile) is read afresh and written again in the same pass,
/// counted as a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_write_is_reported_and_a_conflicting_one_written_afresh() {
    let mut c = node_mode_cluster().await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    settle(&c).await;
    let faults = c.model().faults().clone();
    let row_writes = RequestFilter {
        verbs: vec!["update".to_owned()],
        resource: Some("portmapnodes".to_owned()),
        status_only: false,
    };
    let n1 = |c: &Cluster| c.agent("n1").metrics.clone();
    let refused = |c: &Cluster| n1(c).status_write_refusals(WriteKind::Node, "admission");
    let conflicts = |c: &Cluster| n1(c).status_writes_of(WriteKind::Node, WriteResult::Conflict);
    let (failed_before, conflicts_before) = (n1(&c).passes_failed(), conflicts(&c));

    // n1's row alone changes (its underlay MTU), and every write of it is refused.
    faults.fail_fraction(1.0, Failure::Denied, row_writes.clone());
    c.agent("n1").host.lock().facts.underlay_mtu = Some(1400);
    poke_every_agent(&c, "poke-1").await;
    c.eventually("n1's refused writes are counted", || {
        std::future::ready(refused(&c) >= 3)
    })
    .await;
    faults.clear();
    let failed = n1(&c).passes_failed() - failed_before;
    assert!(
        refused(&c) <= failed + 1,
        "{} refused writes over {failed} failed passes: a refusal was written again in its pass",
        refused(&c)
    );
    assert_eq!(
        conflicts(&c),
        conflicts_before,
        "a refusal was taken for a conflict"
    );
    c.eventually("n1's row lands once the policy allows it", || async {
        row_mtu(&c, "n1").await == Some(1400)
    })
    .await;
    settle(&c).await;

    // Control: the write meets a conflict once; n1 reads its object again and writes in the
    // same pass, refusing nothing and failing no pass.
    let (failed_before, refused_before) = (n1(&c).passes_failed(), refused(&c));
    let conflicts_before = conflicts(&c);
    faults.fail_next(1, Failure::Conflict, row_writes);
    c.agent("n1").host.lock().facts.underlay_mtu = Some(1380);
    poke_every_agent(&c, "poke-2").await;
    c.eventually("n1's row lands after the conflict", || async {
        row_mtu(&c, "n1").await == Some(1380)
    })
    .await;
    assert_eq!(
        faults.injected(),
        refused_before + 1,
        "the conflict was injected once"
    );
    assert_eq!(conflicts(&c), conflicts_before + 1);
    assert_eq!(refused(&c), refused_before);
    assert_eq!(n1(&c).passes_failed(), failed_before);
    c.stop_all().await;
}
