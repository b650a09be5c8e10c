//! Endpoint choice, serving and programming nodes, the `Programmed` gates and the status writer.

use kuport_core::plan::ProgrammedReason as P;
use kuport_testkit::cluster::*;
use serde_json::{Value, json};

fn programmed(c: &Cluster, ns: &str, name: &str) -> (P, String) {
    let plan = c.plan("edge-a");
    let d = decision(&plan, ns, name);
    let p = d
        .programmed
        .as_ref()
        .expect("accepted mappings have Programmed");
    (p.reason, p.message.clone())
}

fn same_node() -> Cluster {
    edge_and_worker().endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
}

#[test]
fn same_node_mapping_is_programmed() {
    let c = same_node().portmap(pm("games", "gs", "public", 3000));
    assert_eq!(programmed(&c, "games", "gs").0, P::AllNodesReady);
    let plan = c.plan("edge-a");
    let d = decision(&plan, "games", "gs");
    assert_eq!(d.serving_node.as_deref(), Some("edge-a"));
    assert_eq!(*d.programming_nodes, ["edge-a"]);
    assert_eq!(d.status_writer.as_deref(), Some("edge-a"));
    assert!(d.links.is_empty());
}

/// The class gives edge-a `enp1s0` and `wt0`; the host has only `enp1s0`. The datapath
/// serves on `enp1s0`, and status says the same: the row is ready and names `wt0`, the mapping
/// is programmed with the missing interface in its message.
#[test]
fn a_node_missing_one_class_interface_serves_on_the_others_and_says_so() {
    let mut c = same_node().portmap(pm("games", "gs", "public", 3000));
    let only_enp1s0 = facts(&[("enp1s0", "203.0.113.9")], "enp1s0", 1400);
    let plan = c.plan_with("edge-a", &only_enp1s0);
    let row = plan.writes.class_rows[0].row.clone();
    assert!(row.ready, "one interface resolves: the node serves");
    assert_eq!(
        row.message.as_deref(),
        Some("interface wt0 not present; serving on enp1s0 only")
    );
    let steered: Vec<String> = plan
        .host_state
        .nft
        .rules(kuport_core::ir::ChainId::Steer)
        .iter()
        .filter_map(|r| match r {
            kuport_core::ir::Rule::Steer(s) => Some(s.iif.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        steered,
        ["enp1s0"],
        "captured only where the address exists"
    );
    // The row as written: the mapping is programmed, and says where it is not served.
    let status = c.class_mut("public").status.as_mut().expect("status");
    status.nodes.retain(|r| r.name != "edge-a");
    status.nodes.push(row);
    let (reason, message) = programmed(&c, "games", "gs");
    assert_eq!(reason, P::AllNodesReady);
    assert_eq!(
        message,
        "programmed, but on node edge-a, interface wt0 not present; serving on enp1s0 only"
    );
    // Control: with no interface at all the node is not ready.
    let none = facts(&[], "enp1s0", 1400);
    let row = &c.plan_with("edge-a", &none).writes.class_rows[0].row;
    assert!(!row.ready);
    assert_eq!(
        row.message.as_deref(),
        Some("interface enp1s0 not present; interface wt0 not present")
    );
}

#[test]
fn no_ready_endpoint_variants() {
    let cases: Vec<(&str, Cluster)> = vec![
        ("no slice", edge_and_worker()),
        (
            "unready",
            edge_and_worker().endpoint_full(
                "games",
                "gs",
                "game",
                "UDP",
                "p",
                "edge-a",
                "10.244.9.1",
                3000,
                Some(false),
            ),
        ),
        (
            "wrong protocol",
            edge_and_worker().endpoint_full(
                "games",
                "gs",
                "game",
                "TCP",
                "p",
                "edge-a",
                "10.244.9.1",
                3000,
                None,
            ),
        ),
        (
            "wrong port name",
            edge_and_worker().endpoint_full(
                "games",
                "gs",
                "rcon",
                "UDP",
                "p",
                "edge-a",
                "10.244.9.1",
                3000,
                None,
            ),
        ),
        (
            "other namespace",
            edge_and_worker().endpoint_full(
                "other",
                "gs",
                "game",
                "UDP",
                "p",
                "edge-a",
                "10.244.9.1",
                3000,
                None,
            ),
        ),
    ];
    for (what, c) in cases {
        let c = c.portmap(pm("games", "gs", "public", 3000));
        let (reason, msg) = programmed(&c, "games", "gs");
        assert_eq!(reason, P::NoReadyEndpoint, "{what}");
        assert!(
            msg.contains("service games/gs has no ready endpoint"),
            "{what}: {msg}"
        );
        let plan = c.plan("edge-a");
        let d = decision(&plan, "games", "gs");
        assert!(
            d.published.is_empty() && d.endpoint.is_none() && plan.host_state.nft.is_empty(),
            "{what}"
        );
        assert_eq!(
            d.status_writer.as_deref(),
            Some("edge-a"),
            "first accepting node writes: {what}"
        );
    }
}

#[test]
fn ready_absent_counts_as_ready() {
    let c = edge_and_worker()
        .endpoint_full(
            "games",
            "gs",
            "game",
            "UDP",
            "p",
            "edge-a",
            "10.244.9.1",
            3000,
            None,
        )
        .portmap(pm("games", "gs", "public", 3000));
    assert_eq!(programmed(&c, "games", "gs").0, P::AllNodesReady);
}

#[test]
fn no_ready_accepting_node() {
    let c = Cluster::new()
        .unready_node("edge-a", "100.64.0.1")
        .node("worker-b", "100.64.0.2")
        .namespace("games", json!({}))
        .class_json("public", vxlan_spec(&[("edge-a", &["wt0"])]), Value::Null)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let (reason, msg) = programmed(&c, "games", "gs");
    assert_eq!(reason, P::NodeNotReady);
    assert_eq!(msg, "class public selects no ready accepting node");
    let plan = c.plan("edge-a");
    assert_eq!(
        decision(&plan, "games", "gs").status_writer.as_deref(),
        Some("worker-b"),
        "endpoint's node writes"
    );
}

#[test]
fn range_with_a_different_pod_port_is_not_programmed() {
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 4000)
        .portmap(pm("games", "gs", "public", 3000).end(3009));
    let (reason, msg) = programmed(&c, "games", "gs");
    assert_eq!(reason, P::RangeTranslation);
    assert!(
        msg.contains("ports 3000-3009 are delivered port for port"),
        "{msg}"
    );
    let plan = c.plan("edge-a");
    assert!(plan.host_state.nft.is_empty() && decision(&plan, "games", "gs").published.is_empty());
}

#[test]
fn single_port_with_a_different_pod_port_is_translated() {
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 4000)
        .portmap(pm("games", "gs", "public", 3000));
    assert_eq!(programmed(&c, "games", "gs").0, P::AllNodesReady);
    let plan = c.plan("edge-a");
    assert_eq!(
        decision(&plan, "games", "gs")
            .endpoint
            .as_ref()
            .map(|e| e.port),
        Some(4000)
    );
}

#[test]
fn none_mode_refuses_a_remote_pod() {
    let c = Cluster::new()
        .node("w1", "100.64.0.1")
        .node("cp", "100.64.0.9")
        .namespace("games", json!({}))
        .class_json("intranet", none_spec(&[("w1", &["wt0"])]), Value::Null)
        .row("intranet", "w1", json!({"wt0": "100.64.0.1"}), 1400)
        .endpoint("games", "gs", "gs-0", "cp", "10.244.9.5", 3000)
        .portmap(pm("games", "gs", "intranet", 3000));
    let plan = c.plan("w1");
    let d = decision(&plan, "games", "gs");
    let p = d.programmed.as_ref().expect("programmed");
    assert_eq!(p.reason, P::ReturnPathUnavailable);
    assert!(
        p.message.contains("class intranet has returnPath None"),
        "{}",
        p.message
    );
    assert!(d.published.is_empty() && d.links.is_empty());
    assert!(
        plan.host_state.nft.is_empty(),
        "refused mappings program nothing"
    );
}

#[test]
fn class_refusing_links_blocks_remote_mappings_only() {
    let mut c = edge_and_worker()
        .endpoint("games", "remote", "r-0", "worker-b", "10.244.1.5", 3000)
        .endpoint("games", "local", "l-0", "edge-a", "10.244.0.5", 3001)
        .portmap(pm("games", "remote", "public", 3000))
        .portmap(pm("games", "local", "public", 3001));
    c.class_mut("public").spec.return_path.vxlan.subnet = "not-a-cidr".into();
    let (reason, msg) = programmed(&c, "games", "remote");
    assert_eq!(reason, P::ReturnPathUnavailable);
    assert!(
        msg.contains("class public builds no return links (InvalidSubnet)"),
        "{msg}"
    );
    assert_eq!(programmed(&c, "games", "local").0, P::AllNodesReady);
}

#[test]
fn missing_or_unready_rows_quote_the_row() {
    let c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .namespace("games", json!({}))
        .class_json("public", vxlan_spec(&[("edge-a", &["wt0"])]), Value::Null)
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    assert_eq!(
        programmed(&c, "games", "gs"),
        (
            P::NodeNotReady,
            "serving node edge-a has not reported its row in class public yet".to_owned()
        )
    );
    let c = c.unready_row("public", "edge-a", "interface wt0 not present");
    assert_eq!(
        programmed(&c, "games", "gs"),
        (
            P::NodeNotReady,
            "serving node edge-a is not ready: interface wt0 not present".to_owned()
        )
    );
    // The gate changes the condition, not the emission.
    let own = facts(&[("wt0", "100.64.0.1")], "wt0", 1400);
    assert!(!c.plan_with("edge-a", &own).host_state.nft.is_empty());
    // Without the interface's own address nothing can be steered, so nothing is captured.
    assert!(c.plan("edge-a").host_state.nft.is_empty());
}

#[test]
fn multi_node_binding_nothing_is_reported() {
    let c = Cluster::new()
        .node("a", "100.64.0.1")
        .node("b", "100.64.0.2")
        .namespace("games", json!({}))
        .class_json(
            "multi",
            json!({"nodes": nodes_json(&[("a", &["wt0", "enp1s0"]), ("b", &["wt0", "eth0"])]),
                   "servingMode": "Multi", "returnPath": {"mode": "Vxlan"}}),
            Value::Null,
        )
        .row("multi", "a", json!({}), 1400)
        .row("multi", "b", json!({}), 1400)
        .endpoint("games", "gs", "gs-0", "a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "multi", 3000).ifaces(&["enp1s0"]));
    let plan = c.plan("a");
    let d = decision(&plan, "games", "gs");
    assert_eq!(*d.programming_nodes, ["a", "b"]);
    let p = d.programmed.as_ref().expect("programmed");
    assert_eq!(p.reason, P::NoInterfaceOnNode);
    assert_eq!(
        p.message,
        "accepting node b binds none of the requested interfaces enp1s0"
    );
    assert_eq!(d.published.len(), 1, "only a binds: {:?}", d.published);
    assert!(
        d.links.is_empty(),
        "b binds nothing, so no link to it is needed"
    );
}

#[test]
fn remote_pod_waits_for_its_claim_then_programs() {
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let (reason, msg) = programmed(&c, "games", "gs");
    assert_eq!(reason, P::ReturnPathUnavailable);
    assert_eq!(
        msg,
        "return link for edge-a/worker-b is not claimed yet: node worker-b proposes it (if this stays, its agent is not running or cannot write the class status)"
    );
    let edge = c.plan("edge-a");
    assert!(
        edge.host_state.nft.is_empty(),
        "no DNAT before the path exists"
    );
    assert!(
        edge.writes.claims.is_empty(),
        "only the pod's node proposes"
    );
    let worker = c.plan("worker-b");
    assert_eq!(worker.writes.claims.len(), 1);
    assert_eq!(
        (
            worker.writes.claims[0].key.as_str(),
            worker.writes.claims[0].slot
        ),
        ("edge-a/worker-b", 0)
    );
    assert!(
        worker.host_state.links.is_empty(),
        "a proposal is not a landed claim"
    );

    let c = c.claim("public", "edge-a/worker-b", 0);
    let (reason, msg) = programmed(&c, "games", "gs");
    assert_eq!(
        reason,
        P::NotAcknowledged,
        "landed, but neither end built it"
    );
    assert_eq!(
        msg,
        "node edge-a has not reported its end of return link edge-a/worker-b in class public: is its kuport agent running? (kuport status lists the agents)"
    );
    let worker = c.plan("worker-b");
    let row = &worker.writes.class_rows[0].row;
    assert_eq!(
        (row.accepting, row.links.len(), row.links[0].slot),
        (Some(false), 1, 0),
        "the pod's node, which the class does not name, acknowledges its end in a row of its own"
    );
    let half = c.clone().link_ends("public", "edge-a/worker-b", 0, None);
    let half = {
        // Only the accepting end reported.
        let mut half = half;
        let status = half.class_mut("public").status.as_mut().expect("status");
        status.nodes.retain(|r| r.name != "worker-b");
        half
    };
    let (reason, msg) = programmed(&half, "games", "gs");
    assert_eq!(reason, P::NotAcknowledged);
    assert!(msg.starts_with("node worker-b has not reported"), "{msg}");
    let stale = c.clone().link_ends("public", "edge-a/worker-b", 3, None);
    let (reason, msg) = programmed(&stale, "games", "gs");
    assert_eq!(reason, P::NotAcknowledged);
    assert!(
        msg.contains("at slot 3, not the link's current slot"),
        "{msg}"
    );
    let down = c
        .clone()
        .link_ends("public", "edge-a/worker-b", 0, Some(false));
    let (reason, msg) = programmed(&down, "games", "gs");
    assert_eq!(reason, P::ReturnLinkDown);
    assert_eq!(
        msg,
        "return link edge-a/worker-b is down as node edge-a sees it: its probes get no answer"
    );
    let c = c.link_ends("public", "edge-a/worker-b", 0, Some(true));
    assert_eq!(programmed(&c, "games", "gs").0, P::AllNodesReady);
    let d = decision(&c.plan("edge-a"), "games", "gs").clone();
    assert_eq!(d.links.len(), 1);
    assert!(d.links[0].landed && d.links[0].slot == Some(0));
    assert_eq!(d.status_writer.as_deref(), Some("edge-a"));
}

/// `settling` marks a status that waits only for another agent's next step (the claim its
/// pod-side node proposes, an end not yet acknowledged), which the agent may hold back for a
/// moment; a link found down or a working mapping is no such step.
#[test]
fn settling_marks_only_the_step_another_agent_takes_next() {
    let settling = |c: &Cluster| {
        let plan = c.plan("edge-a");
        let write = plan.writes.portmaps.iter().find(|w| w.name == "gs");
        write.expect("edge-a writes the status of gs").settling
    };
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    assert!(settling(&c), "the claim is proposed, not landed");
    let c = c.claim("public", "edge-a/worker-b", 0);
    assert!(settling(&c), "landed, not acknowledged");
    let down = c
        .clone()
        .link_ends("public", "edge-a/worker-b", 0, Some(false));
    assert!(!settling(&down), "a link found down is written at once");
    let up = c.link_ends("public", "edge-a/worker-b", 0, Some(true));
    assert!(!settling(&up));
}

#[test]
fn a_link_end_without_internal_ip_is_reported() {
    let c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .node_without_ip("worker-b")
        .namespace("games", json!({}))
        .class_json("public", vxlan_spec(&[("edge-a", &["wt0"])]), Value::Null)
        .row("public", "edge-a", json!({}), 1400)
        .claim("public", "edge-a/worker-b", 0)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let (reason, msg) = programmed(&c, "games", "gs");
    assert_eq!(reason, P::ReturnPathUnavailable);
    assert!(
        msg.contains("node worker-b has no IPv4 InternalIP"),
        "{msg}"
    );
    assert!(c.plan("edge-a").host_state.nft.is_empty());
}

#[test]
fn endpoint_tie_breaks() {
    let base = || {
        Cluster::new()
            .node("a", "100.64.0.1")
            .node("b", "100.64.0.2")
            .node("c", "100.64.0.3")
            .namespace("games", json!({}))
            .class_json(
                "k",
                vxlan_spec(&[("b", &["wt0"]), ("c", &["wt0"])]),
                Value::Null,
            )
            .portmap(pm("games", "gs", "k", 3000))
    };
    let chosen = |c: &Cluster| {
        let plan = c.plan("a");
        let ep = decision(&plan, "games", "gs")
            .endpoint
            .clone()
            .expect("endpoint");
        (ep.node, ep.address.to_string())
    };
    // (a) an accepting node first, by its rank among the sorted accepting nodes.
    let c = base()
        .endpoint("games", "gs", "p0", "a", "10.244.9.1", 3000)
        .endpoint("games", "gs", "p9", "c", "10.244.9.3", 3000)
        .endpoint("games", "gs", "p5", "b", "10.244.9.2", 3000);
    assert_eq!(chosen(&c), ("b".into(), "10.244.9.2".into()));
    // (b) then the pod name.
    let c = base()
        .endpoint("games", "gs", "p2", "a", "10.244.9.1", 3000)
        .endpoint("games", "gs", "p1", "a", "10.244.9.9", 3000);
    assert_eq!(chosen(&c).1, "10.244.9.9");
    // (c) then the node name, (d) then the address.
    let c = base()
        .endpoint("games", "gs", "p", "z", "10.244.9.1", 3000)
        .endpoint("games", "gs", "p", "y", "10.244.9.2", 3000);
    assert_eq!(chosen(&c).0, "y");
    let c = base()
        .endpoint("games", "gs", "p", "y", "10.244.9.7", 3000)
        .endpoint("games", "gs", "p", "y", "10.244.9.3", 3000);
    assert_eq!(chosen(&c).1, "10.244.9.3");
}

#[test]
fn serving_node_is_the_pod_node_when_it_accepts_else_the_first_accepting() {
    let c = Cluster::new()
        .node("a", "100.64.0.1")
        .node("b", "100.64.0.2")
        .node("w", "100.64.0.3")
        .namespace("games", json!({}))
        .class_json(
            "k",
            vxlan_spec(&[("a", &["wt0"]), ("b", &["wt0"])]),
            Value::Null,
        )
        .endpoint("games", "on-b", "p", "b", "10.244.9.2", 3000)
        .endpoint("games", "on-w", "p", "w", "10.244.9.3", 3000)
        .portmap(pm("games", "on-b", "k", 3000))
        .portmap(pm("games", "on-w", "k", 3001));
    let plan = c.plan("a");
    assert_eq!(
        decision(&plan, "games", "on-b").serving_node.as_deref(),
        Some("b")
    );
    assert_eq!(
        decision(&plan, "games", "on-w").serving_node.as_deref(),
        Some("a")
    );
}

#[test]
fn status_writer_of_a_mapping_without_class_is_the_first_node() {
    let c = edge_and_worker().portmap(pm("games", "gs", "missing", 3000));
    let plan = c.plan("worker-b");
    let d = decision(&plan, "games", "gs");
    assert!(
        d.programmed.is_none(),
        "Programmed exists only while Accepted"
    );
    assert_eq!(d.status_writer.as_deref(), Some("edge-a"));
    assert!(plan.writes.portmaps.is_empty());
    assert_eq!(c.plan("edge-a").writes.portmaps.len(), 1);
}

#[test]
fn published_rows_fill_addresses_from_facts_and_rows() {
    let c = edge_and_worker()
        .endpoint("games", "gs", "gs-0", "edge-a", "10.244.0.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let from_rows = c.plan("worker-b");
    let rows: Vec<(String, String, String)> = decision(&from_rows, "games", "gs")
        .published
        .iter()
        .map(|p| (p.node.clone(), p.interface.clone(), p.address.clone()))
        .collect();
    assert_eq!(
        rows,
        [
            ("edge-a".into(), "enp1s0".into(), "203.0.113.9".into()),
            ("edge-a".into(), "wt0".into(), "100.64.0.1".into())
        ]
    );
    let own = c.plan_with("edge-a", &facts(&[("enp1s0", "198.51.100.7")], "wt0", 1400));
    let addrs: Vec<&str> = decision(&own, "games", "gs")
        .published
        .iter()
        .map(|p| p.address.as_str())
        .collect();
    assert_eq!(
        addrs,
        ["198.51.100.7", ""],
        "this node's rows come from its own facts"
    );
}

#[test]
fn programmed_status_carries_generation_and_keeps_transition_time() {
    let c = same_node().portmap(pm("games", "gs", "public", 3000));
    let plan = c.plan("edge-a");
    let write = &plan.writes.portmaps[0];
    assert_eq!(write.status.observed_generation, Some(2));
    let types: Vec<&str> = write
        .status
        .conditions
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, ["Accepted", "Programmed"]);
    assert!(
        write
            .status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(2))
    );
    assert_eq!(write.status.conditions[0].last_transition_time.0, now());

    // A stored condition with the same status keeps its time; a flipped one gets now.
    let mut c2 = c.clone();
    let earlier: k8s_openapi::jiff::Timestamp = "2026-01-05T00:00:00Z".parse().expect("ts");
    let mut stored = write.status.clone();
    for cond in &mut stored.conditions {
        cond.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(earlier);
    }
    stored.conditions[1].status = "False".into();
    c2.snapshot.portmaps[0].status = Some(stored);
    let again = c2.plan("edge-a");
    let conds = &again.writes.portmaps[0].status.conditions;
    assert_eq!(
        conds[0].last_transition_time.0, earlier,
        "Accepted did not flip"
    );
    assert_eq!(conds[1].last_transition_time.0, now(), "Programmed flipped");
}

/// Two accepting edges (edge-a serves, edge-c stands by) and a pod on worker-b, which accepts
/// nothing: a Single class with the default subnet.
fn two_edges() -> Cluster {
    two_edges_and_worker(kuport_core::api::DEFAULT_VXLAN_SUBNET)
}

fn edge_facts(addr: &str) -> kuport_core::snapshot::HostFacts {
    facts(&[("wt0", addr)], "wt0", 1400)
}

#[test]
fn a_standby_link_does_not_hold_up_programmed() {
    let c = two_edges().claim_built("public", "edge-a/worker-b", 0);
    let d = decision(&c.plan("edge-a"), "games", "gs").clone();
    assert_eq!(d.serving_node.as_deref(), Some("edge-a"));
    let keys = |l: &[kuport_core::plan::NeededLink]| -> Vec<String> {
        l.iter().map(|l| l.key.to_string()).collect()
    };
    assert_eq!(keys(&d.links), ["edge-a/worker-b"]);
    assert_eq!(keys(&d.standby_links), ["edge-c/worker-b"]);
    assert!(!d.standby_links[0].landed);
    assert_eq!(
        programmed(&c, "games", "gs").0,
        P::AllNodesReady,
        "only the serving link gates Programmed"
    );
}

#[test]
fn both_ends_of_a_standby_link_are_programmed_once_claimed() {
    use kuport_core::ir::{ChainId, Rule};
    let c = two_edges()
        .claim_built("public", "edge-a/worker-b", 0)
        .claim_built("public", "edge-c/worker-b", 1);
    let worker = c.plan_with("worker-b", &facts(&[], "wt0", 1400));
    let mut peers: Vec<&str> = worker
        .host_state
        .links
        .iter()
        .map(|l| l.peer.as_str())
        .collect();
    peers.sort_unstable();
    assert_eq!(peers, ["edge-a", "edge-c"], "the pod node holds both links");
    assert_eq!(
        worker.host_state.rules.len(),
        4,
        "loop guard and reply rule per link"
    );
    assert_eq!(worker.host_state.routes.len(), 2);
    let dnat_links: Vec<String> = worker
        .host_state
        .nft
        .rules(ChainId::Pre)
        .iter()
        .filter_map(|r| match r {
            Rule::Dnat(d) => Some(d.iif.clone()),
            _ => None,
        })
        .collect();
    let names: Vec<String> = worker
        .host_state
        .links
        .iter()
        .map(|l| l.name.clone())
        .collect();
    assert_eq!(
        dnat_links, names,
        "arrival DNAT on both links, each matching only its own link"
    );
    // The standby edge builds the link and nothing that captures traffic.
    let standby = c.plan_with("edge-c", &edge_facts("100.64.0.3"));
    assert_eq!(standby.host_state.links.len(), 1);
    assert_eq!(standby.host_state.links[0].peer, "worker-b");
    assert!(standby.host_state.nft.rules(ChainId::Pre).is_empty());
    assert!(standby.host_state.nft.rules(ChainId::Steer).is_empty());
    assert!(standby.host_state.rules.is_empty() && standby.host_state.routes.is_empty());
    assert!(standby.writes.claims.is_empty() && standby.writes.gc.is_empty());
    // The serving edge forwards over its own link.
    let serving = c.plan_with("edge-a", &edge_facts("100.64.0.1"));
    assert_eq!(serving.host_state.links.len(), 1);
    assert!(!serving.host_state.nft.rules(ChainId::Pre).is_empty());
}

#[test]
fn moving_the_serving_edge_waits_for_no_claim_and_changes_only_the_new_edges_capture() {
    use kuport_core::ir::ChainId;
    let before = two_edges()
        .claim_built("public", "edge-a/worker-b", 0)
        .claim_built("public", "edge-c/worker-b", 1);
    // edge-a goes NotReady: edge-c takes over.
    let mut after = before.clone();
    for node in &mut after.snapshot.nodes {
        if node.metadata.name.as_deref() == Some("edge-a") {
            for c in node
                .status
                .iter_mut()
                .flat_map(|s| s.conditions.iter_mut().flatten())
            {
                if c.type_ == "Ready" {
                    c.status = "False".into();
                }
            }
        }
    }
    let edge_c = |c: &Cluster| c.plan_with("edge-c", &edge_facts("100.64.0.3"));
    let worker_facts = facts(&[], "wt0", 1400);
    let worker_before = before.plan_with("worker-b", &worker_facts);
    // The host keeps the ids its links were built with (read back from their tables).
    let mut worker_facts_after = worker_facts.clone();
    let base = worker_facts.marks.base;
    for l in &worker_before.host_state.links {
        worker_facts_after
            .link_ids
            .insert(l.name.clone(), l.mark - base);
    }
    let worker_after = after.plan_with("worker-b", &worker_facts_after);
    let d = decision(&edge_c(&after), "games", "gs").clone();
    assert_eq!(d.serving_node.as_deref(), Some("edge-c"));
    assert_eq!(
        d.programmed.as_ref().map(|p| p.reason),
        Some(P::AllNodesReady),
        "programmed at once: {:?}",
        d.programmed
    );
    for node in ["edge-a", "edge-c", "worker-b"] {
        assert!(
            after.plan(node).writes.claims.is_empty(),
            "{node} proposes nothing: the new pair's claim is already there"
        );
    }
    // The new serving edge keeps its link as it was and adds its capture.
    let (old, new) = (edge_c(&before), edge_c(&after));
    assert_eq!(old.host_state.links, new.host_state.links);
    assert!(old.host_state.nft.rules(ChainId::Pre).is_empty());
    assert!(!new.host_state.nft.rules(ChainId::Pre).is_empty());
    // The pod node's link to edge-c, its rules and route stay exactly as they were; only the
    // link to the edge that left goes.
    let (old, new) = (worker_before, worker_after);
    let kept = |p: &kuport_core::plan::Plan| {
        let link = p
            .host_state
            .links
            .iter()
            .find(|l| l.peer == "edge-c")
            .cloned()
            .expect("link to edge-c");
        let rules: Vec<_> = p
            .host_state
            .rules
            .iter()
            .filter(|r| r.fwmark == link.mark)
            .cloned()
            .collect();
        let routes: Vec<_> = p
            .host_state
            .routes
            .iter()
            .filter(|r| r.dev == link.name)
            .cloned()
            .collect();
        (link, rules, routes)
    };
    assert_eq!(kept(&old), kept(&new));
    assert_eq!(new.host_state.links.len(), 1);
}

#[test]
fn a_refused_standby_link_is_not_reported_against_the_mapping() {
    use kuport_core::plan::link_name;
    use kuport_core::snapshot::KernelRefusal;
    let c = two_edges()
        .claim_built("public", "edge-a/worker-b", 0)
        .claim_built("public", "edge-c/worker-b", 1);
    let refused = |peer: &str| {
        let mut f = facts(&[("wt0", "100.64.0.2")], "wt0", 1400);
        let link = link_name("public", peer);
        f.refusals = vec![KernelRefusal {
            mapping: "games/gs".into(),
            message: format!("the kernel refused its return link {link}: File exists"),
            link: Some(link),
        }];
        f
    };
    // The pod's node: its link to edge-c only keeps a failover ready.
    let standby = c.plan_with("worker-b", &refused("edge-c"));
    assert!(
        standby.writes.refusals.is_empty(),
        "{:?}",
        standby.writes.refusals
    );
    // Its link to edge-a carries the mapping's traffic: that refusal is the mapping's.
    let serving = c.plan_with("worker-b", &refused("edge-a"));
    let mappings: Vec<&str> = serving
        .writes
        .refusals
        .iter()
        .map(|r| r.mapping.as_str())
        .collect();
    assert_eq!(mappings, ["games/gs"]);
}

/// Class `public` on edge-a alone (Single, Vxlan); the mapping `games/gs` has a ready pod on
/// worker-b (chosen: `gs-0` sorts first) and one on worker-c, unless `b_ready` is false.
fn two_pods(b_ready: bool) -> Cluster {
    let c = three_nodes()
        .node("worker-c", "100.64.0.4")
        .class_json("public", vxlan_spec(&[("edge-a", &["wt0"])]), Value::Null)
        .row("public", "edge-a", json!({"wt0": "100.64.0.1"}), 1400)
        .endpoint_full(
            "games",
            "gs",
            "game",
            "UDP",
            "gs-0",
            "worker-b",
            "10.244.1.5",
            3000,
            Some(b_ready),
        )
        .endpoint("games", "gs", "gs-1", "worker-c", "10.244.2.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    c.claim_built("public", "edge-a/worker-b", 0)
}

#[test]
fn the_next_endpoints_node_keeps_a_standby_link_so_an_endpoint_change_waits_for_no_claim() {
    use kuport_core::ir::ChainId;
    let keys = |l: &[kuport_core::plan::NeededLink]| -> Vec<String> {
        l.iter().map(|l| l.key.to_string()).collect()
    };
    let before = two_pods(true);
    let d = decision(&before.plan("edge-a"), "games", "gs").clone();
    assert_eq!(
        d.endpoint.as_ref().map(|e| e.node.as_str()),
        Some("worker-b")
    );
    assert_eq!(keys(&d.links), ["edge-a/worker-b"]);
    assert_eq!(keys(&d.standby_links), ["edge-a/worker-c"]);
    // The next endpoint's node proposes the claim ahead of need: a claim is always proposed by
    // one of its two nodes (the admission policy refuses a write of a claim between two
    // others), so the current endpoint's node does not.
    let proposals = |node: &str| -> Vec<String> {
        before
            .plan(node)
            .writes
            .claims
            .iter()
            .map(|p| p.key.clone())
            .collect()
    };
    assert_eq!(proposals("worker-c"), ["edge-a/worker-c"]);
    assert!(
        proposals("worker-b").is_empty(),
        "{:?}",
        proposals("worker-b")
    );

    // Once claimed, both ends build the device and nothing that captures traffic.
    let claimed = before.clone().claim_built("public", "edge-a/worker-c", 1);
    let standby_end = claimed.plan_with("worker-c", &facts(&[("wt0", "100.64.0.4")], "wt0", 1400));
    assert_eq!(standby_end.host_state.links.len(), 1);
    assert_eq!(standby_end.host_state.links[0].peer, "edge-a");
    assert!(standby_end.host_state.nft.rules(ChainId::Pre).is_empty());
    let edge = claimed.plan_with("edge-a", &facts(&[("wt0", "100.64.0.1")], "wt0", 1400));
    assert_eq!(
        edge.host_state.links.len(),
        2,
        "the serving link and the standby one"
    );

    // worker-b's pod goes unready: the mapping moves to worker-c over the link already there.
    let mut after = two_pods(false).claim_built("public", "edge-a/worker-c", 1);
    after.snapshot.endpoint_slices.reverse();
    let moved = after.plan_with("edge-a", &facts(&[("wt0", "100.64.0.1")], "wt0", 1400));
    let d = decision(&moved, "games", "gs");
    assert_eq!(
        d.endpoint.as_ref().map(|e| e.node.as_str()),
        Some("worker-c")
    );
    assert_eq!(keys(&d.links), ["edge-a/worker-c"]);
    assert!(d.links[0].landed);
    assert_eq!(
        d.programmed.as_ref().map(|p| p.reason),
        Some(P::AllNodesReady)
    );
    assert!(moved.writes.claims.is_empty(), "{:?}", moved.writes.claims);
}
