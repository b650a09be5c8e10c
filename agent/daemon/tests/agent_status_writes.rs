//! How the agents write status, with three agents in one process (`common`): the PortMap
//! status writer changes hands, 409 storms converge, writes go out a few at a time, a held
//! write never holds the datapath, and a mapping changed many times a second is written within
//! its budget and ends saying its last state. The first scenario runs on both servers.

mod common;

use std::time::Duration;

use kube::api::{Api, ListParams, PostParams};
use kuport::agent::{WriteKind, WriteResult};
use kuport_core::api::{PortMap, PortMapClass};
use kuport_sim::apiserver::{Failure, RequestFilter};

use common::{
    Cluster, Target, dnat_targets, on_both_servers, poke_every_agent, programmed_true, row_mtu,
    settle,
};

async fn status_writer_changes_hands_when_no_node_serves(target: Target) {
    let Some(mut c) = Cluster::start_on(
        target,
        "status_writer_changes_hands_when_no_node_serves",
        Duration::from_secs(3600),
    )
    .await
    else {
        return;
    };
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    // Take n1 out of the class: nobody accepts, so the writer is the pod's node (n2).
    let before = c
        .agent("n2")
        .metrics
        .status_writes_of(WriteKind::PortMap, WriteResult::Written);
    let classes: Api<PortMapClass> = Api::all(c.client.clone());
    let mut class = c.class().await;
    class.spec.nodes = [(
        "n3".to_owned(),
        kuport_core::api::ClassNode {
            interfaces: vec!["missing0".to_owned()],
        },
    )]
    .into_iter()
    .collect();
    classes
        .replace("public", &PostParams::default(), &class)
        .await
        .expect("class replaced");
    c.eventually("the old serving node's rules go", || async {
        dnat_targets(&c.agent("n1").host).is_empty()
    })
    .await;
    c.eventually("a new writer reports Programmed=False", || async {
        c.condition("Programmed")
            .await
            .is_some_and(|(s, _)| s == "False")
    })
    .await;
    // The writer counts a write only after the API server answered it, so the condition can be
    // read before the count moves: wait for the count too.
    let written = |node: &str| {
        c.agent(node)
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Written)
    };
    c.eventually("another node took over the PortMap status", || async {
        written("n2") + written("n3") > before
    })
    .await;
    // n1 no longer accepts: its row is removed, and n3's (not ready) row appears (a pod's
    // node's row of link ends, `accepting: false`, is no accepting row).
    c.eventually("rows follow the class's nodes", || async {
        c.class().await.status.is_some_and(|s| {
            let accepting: Vec<_> = s
                .nodes
                .iter()
                .filter(|n| n.accepting != Some(false))
                .collect();
            accepting
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                == ["n3"]
                && !accepting[0].ready
        })
    })
    .await;
    c.stop_all().await;
}

on_both_servers!(status_writer_changes_hands_when_no_node_serves);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_storms_on_portmap_status_converge() {
    let mut c = Cluster::start().await;
    c.model().faults().fail_next(
        20,
        Failure::Conflict,
        RequestFilter::writes().resource("portmaps").status(),
    );
    c.eventually("Programmed=True despite 409s", || programmed_true(&c))
        .await;
    assert!(
        c.agent("n1")
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Conflict)
            > 0,
        "the writer saw the conflicts"
    );
    c.stop_all().await;
}

/// A pass's PortMap status writes go out a few at a time, not one after another: against an API
/// server that answers each status write after 200 ms, several are held at once, and never more
/// than the agent's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portmap_status_writes_run_a_few_at_a_time() {
    let mut c = Cluster::empty_on(Target::Model, "writes-in-flight")
        .await
        .expect("model");
    c.seed().await;
    for i in 0..11u16 {
        c.create_portmap(&format!("extra-{i}"), 3001 + i).await;
    }
    c.model().faults().slow_down(
        RequestFilter::writes().resource("portmaps").status(),
        Duration::from_millis(200),
    );
    let hour = Duration::from_secs(3600);
    for i in 1..=3 {
        c.start_agent(i, hour);
    }
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    c.eventually("every PortMap has its status", || async {
        portmaps
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.len() == 12 && l.items.iter().all(|pm| pm.status.is_some()))
    })
    .await;
    let most = c.model().faults().most_slowed_at_once();
    assert!((2..=8).contains(&most), "{most} status writes held at once");
    c.stop_all().await;
}

/// The datapath never waits for status writes. With the API server holding every PortMap status
/// write for 5 s, the pod moves to the serving node and, while the write saying so is held, back:
/// the serving node follows it back within a bound far below the held write (before, the pass
/// loop sat in that write). The status then catches up with the newest move, not the held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_status_write_does_not_hold_the_datapath() {
    const HELD: Duration = Duration::from_secs(5);
    let mut c = Cluster::empty_on(Target::Model, "held-status-write")
        .await
        .expect("model");
    // Longer than the held writes: they succeed, slowly, rather than time out.
    c.api_timeout = Duration::from_secs(20);
    c.seed().await;
    c.start_agents_until_programmed().await;
    let over_the_link = || {
        let n1 = c.agent("n1").host.applied();
        n1.links.len() == 1
            && dnat_targets(&c.agent("n1").host) == [n1.links[0].peer_address.to_string()]
    };
    c.eventually("the serving node DNATs over the link", || async {
        over_the_link()
    })
    .await;
    let written = || {
        c.agent("n1")
            .metrics
            .status_writes_of(WriteKind::PortMap, WriteResult::Written)
    };
    let written_before = written();
    c.model()
        .faults()
        .slow_down(RequestFilter::writes().resource("portmaps").status(), HELD);
    c.set_endpoint(Some(1), false).await;
    c.eventually("the serving node delivers to the pod on itself", || async {
        dnat_targets(&c.agent("n1").host) == ["10.244.1.5"]
    })
    .await;
    c.eventually("the status write of that move is held", || async {
        c.model().faults().most_slowed_at_once() >= 1
    })
    .await;
    let moved = tokio::time::Instant::now();
    c.set_endpoint(Some(2), false).await;
    c.eventually("the serving node DNATs over the link again", || async {
        over_the_link()
    })
    .await;
    let took = moved.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "the datapath followed the pod after {took:?}, with a status write held for {HELD:?}"
    );
    // Both moves are written, in order: the held one, then the newest, which took over from
    // the pass whose write was held.
    c.eventually("the status names the pod's node, n2, last", || async {
        written() >= written_before + 2
            && c.portmap()
                .await
                .status
                .and_then(|s| s.endpoint)
                .is_some_and(|e| e.node == "n2")
    })
    .await;
    assert!(c.agent("n1").metrics.passes_superseded() >= 1);
    c.stop_all().await;
}

/// The same status patch answered two ways, as kube-apiserver answers them (`refusal.rs`): a
/// refusal (an admission policy's 422) is counted with its reason, fails the pass and is not
/// written again before the pass's retry, one write a pass; a guard that failed (the row moved)
/// is merged into a fresh read and written again in the same pass, counted as a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_patch_is_reported_and_a_moved_one_written_afresh() {
    let mut c = Cluster::start().await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    settle(&c).await;
    let faults = c.model().faults().clone();
    let row_patches = RequestFilter {
        verbs: vec!["patch".to_owned()],
        resource: Some("portmapclasses".to_owned()),
        status_only: true,
    };
    let n1 = |c: &Cluster| c.agent("n1").metrics.clone();
    let refused = |c: &Cluster| n1(c).status_write_refusals(WriteKind::Class, "admission");
    let conflicts = |c: &Cluster| n1(c).status_writes_of(WriteKind::Class, WriteResult::Conflict);
    let (failed_before, conflicts_before) = (n1(&c).passes_failed(), conflicts(&c));

    // n1's row alone changes (its underlay MTU), and every patch of it is refused.
    faults.fail_fraction(1.0, Failure::Denied, row_patches.clone());
    c.agent("n1").host.lock().facts.underlay_mtu = Some(1400);
    poke_every_agent(&c, "poke-1").await;
    c.eventually("n1's refused patches are counted", || {
        std::future::ready(refused(&c) >= 3)
    })
    .await;
    faults.clear();
    let failed = n1(&c).passes_failed() - failed_before;
    assert!(
        refused(&c) <= failed + 1,
        "{} refused patches over {failed} failed passes: a refusal was written again in its pass",
        refused(&c)
    );
    assert_eq!(
        conflicts(&c),
        conflicts_before,
        "a refusal was taken for a row that moved"
    );
    c.eventually("n1's row lands once the policy allows it", || async {
        row_mtu(&c, "n1").await == Some(1400)
    })
    .await;
    settle(&c).await;

    // Control: the patch's guard fails once (another writer moved the row); n1 reads the class
    // again and writes in the same pass, refusing nothing and failing no pass.
    let (failed_before, refused_before) = (n1(&c).passes_failed(), refused(&c));
    let conflicts_before = conflicts(&c);
    faults.fail_next(1, Failure::PatchNotApplied, row_patches);
    c.agent("n1").host.lock().facts.underlay_mtu = Some(1380);
    poke_every_agent(&c, "poke-2").await;
    c.eventually("n1's row lands after its guard failed", || async {
        row_mtu(&c, "n1").await == Some(1380)
    })
    .await;
    assert_eq!(
        faults.injected(),
        refused_before + 1,
        "the guard failed once"
    );
    assert_eq!(conflicts(&c), conflicts_before + 1);
    assert_eq!(refused(&c), refused_before);
    assert_eq!(n1(&c).passes_failed(), failed_before);
    c.stop_all().await;
}

/// A tenant toggles its mapping's interfaces 20 times in about a second (every toggle a new
/// generation and a status to write): the writes stay within the object's budget (a burst of
/// 5, then one per 2 s) and the status ends at the last generation, written when the budget
/// allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_toggled_fast_is_written_within_its_budget_and_ends_right() {
    use kube::api::{Patch, PatchParams};
    let mut c = Cluster::start().await;
    c.eventually("Programmed=True", || programmed_true(&c))
        .await;
    common::settle(&c).await;
    let count = |result: WriteResult| -> u64 {
        c.agents
            .iter()
            .map(|a| a.metrics.status_writes_of(WriteKind::PortMap, result))
            .sum()
    };
    let before = count(WriteResult::Written);
    let portmaps: Api<PortMap> = Api::namespaced(c.client.clone(), "games");
    for i in 0..20 {
        let interfaces = if i % 2 == 0 { vec!["eth0"] } else { vec![] };
        portmaps
            .patch(
                "game",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"interfaces": interfaces}})),
            )
            .await
            .expect("toggled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let generation = c.portmap().await.metadata.generation;
    c.eventually("the status says the last generation", || async {
        c.portmap()
            .await
            .status
            .is_some_and(|s| s.observed_generation == generation)
    })
    .await;
    let written = count(WriteResult::Written) - before;
    // About a second of toggles and the wait for the last token: the burst and two more.
    assert!(written <= 8, "{written} writes for 20 toggles");
    assert!(
        count(WriteResult::Deferred) > 0,
        "writes past the budget were held"
    );
    c.stop_all().await;
}
