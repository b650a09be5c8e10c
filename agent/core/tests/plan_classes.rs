//! Class `Ready` reasons, link slots, garbage collection and link identifiers.

use kuport_core::plan::{ClassReason as C, GcKind, ProgrammedReason as P};
use kuport_testkit::cluster::*;
use serde_json::{Value, json};

fn ready(plan: &kuport_core::plan::Plan, class: &str) -> (C, String) {
    let c = plan
        .classes
        .iter()
        .find(|c| c.name == class)
        .expect("class decision");
    (c.ready.reason, c.ready.message.clone())
}

fn vxlan_with(subnet: &str, vni: i64, port: i64) -> Value {
    json!({"nodes": nodes_json(&[("edge-a", &["wt0"])]),
           "returnPath": {"mode": "Vxlan", "vxlan": {"subnet": subnet, "vni": vni, "port": port}}})
}

#[test]
fn valid_and_none_classes() {
    let c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .class_json("v", vxlan_with("169.254.77.0/24", 4242, 4790), Value::Null)
        .class_json(
            "n",
            json!({"nodes": nodes_json(&[("edge-a", &["wt0"])]),
            "returnPath": {"mode": "None", "vxlan": {"subnet": "garbage"}}}),
            Value::Null,
        );
    let plan = c.plan("edge-a");
    assert_eq!(ready(&plan, "v"), (C::Valid, String::new()));
    assert_eq!(
        ready(&plan, "n").0,
        C::Valid,
        "None classes are always Valid"
    );
}

#[test]
fn invalid_subnets() {
    for (subnet, expected) in [
        ("not-a-cidr", "is not an IPv4 CIDR"),
        ("169.254.77.0", "is not an IPv4 CIDR"),
        ("fd00::/64", "is not an IPv4 CIDR"),
        ("169.254.77.9/32", "too small to hold a /31"),
    ] {
        let c = Cluster::new().node("edge-a", "100.64.0.1").class_json(
            "v",
            vxlan_with(subnet, 4242, 4790),
            Value::Null,
        );
        let (reason, msg) = ready(&c.plan("edge-a"), "v");
        assert_eq!(reason, C::InvalidSubnet, "{subnet}");
        assert!(msg.contains(expected), "{subnet}: {msg}");
    }
}

#[test]
fn overlaps_are_reported_by_the_later_class() {
    let mut c = Cluster::new().node("edge-a", "100.64.0.1");
    c.push_class(
        "first",
        "2026-01-01T00:00:00Z",
        vxlan_with("169.254.77.0/24", 4242, 4790),
        Value::Null,
    );
    c.push_class(
        "a-later-subnet",
        "2026-01-02T00:00:00Z",
        vxlan_with("169.254.77.128/25", 9000, 4790),
        Value::Null,
    );
    c.push_class(
        "b-later-vni",
        "2026-01-03T00:00:00Z",
        vxlan_with("169.254.78.0/24", 4300, 4790),
        Value::Null,
    );
    c.push_class(
        "c-wrapped-vni",
        "2026-01-04T00:00:00Z",
        vxlan_with("169.254.79.0/24", 65536 + 4250, 4790),
        Value::Null,
    );
    c.push_class(
        "d-clear",
        "2026-01-05T00:00:00Z",
        vxlan_with("169.254.80.0/24", 20000, 4790),
        Value::Null,
    );
    c.push_class(
        "e-local-mark",
        "2026-01-06T00:00:00Z",
        vxlan_with("169.254.81.0/24", 131070, 4790),
        Value::Null,
    );
    let plan = c.plan("edge-a");
    assert_eq!(
        ready(&plan, "first").0,
        C::Valid,
        "the earlier class keeps working"
    );
    let (reason, msg) = ready(&plan, "a-later-subnet");
    assert_eq!(reason, C::ReturnPathOverlap);
    assert!(
        msg.contains("overlaps subnet 169.254.77.0/24 of class first"),
        "{msg}"
    );
    let (reason, msg) = ready(&plan, "b-later-vni");
    assert_eq!(reason, C::ReturnPathOverlap);
    assert!(msg.contains("of class first"), "{msg}");
    assert_eq!(
        ready(&plan, "c-wrapped-vni").0,
        C::ReturnPathOverlap,
        "VNI ranges compare modulo 65536"
    );
    assert_eq!(ready(&plan, "d-clear").0, C::Valid);
    let (reason, msg) = ready(&plan, "e-local-mark");
    assert_eq!(reason, C::ReturnPathOverlap);
    assert!(msg.contains("local mark"), "{msg}");
}

#[test]
fn link_port_equal_to_the_cni_port_conflicts() {
    let c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .class_json("v", vxlan_with("169.254.77.0/24", 4242, 8472), Value::Null)
        .class_json("n", none_spec(&[("edge-a", &["wt0"])]), Value::Null);
    assert_eq!(
        ready(&c.plan("edge-a"), "v").0,
        C::Valid,
        "no CNI config, no check"
    );
    let c = c.cni_port(8472);
    let (reason, msg) = ready(&c.plan("edge-a"), "v");
    assert_eq!(reason, C::VxlanPortConflict);
    assert!(
        msg.contains("link port 8472 of class v is the VXLAN port of the CNI (cilium)"),
        "{msg}"
    );
    assert_eq!(ready(&c.plan("edge-a"), "n").0, C::Valid);
}

#[test]
fn first_failing_class_reason_wins() {
    let mut c = Cluster::new().node("edge-a", "100.64.0.1").cni_port(4790);
    c.push_class(
        "a",
        "2026-01-01T00:00:00Z",
        vxlan_with("169.254.77.0/24", 4242, 4790),
        Value::Null,
    );
    c.push_class(
        "b",
        "2026-01-02T00:00:00Z",
        vxlan_with("bad", 4242, 4790),
        Value::Null,
    );
    c.push_class(
        "c",
        "2026-01-03T00:00:00Z",
        vxlan_with("169.254.77.0/24", 4242, 4790),
        Value::Null,
    );
    let plan = c.plan("edge-a");
    assert_eq!(ready(&plan, "a").0, C::VxlanPortConflict);
    assert_eq!(
        ready(&plan, "b").0,
        C::InvalidSubnet,
        "InvalidSubnet before the port check"
    );
    assert_eq!(
        ready(&plan, "c").0,
        C::ReturnPathOverlap,
        "overlap before the port check"
    );
}

/// Three workers whose pods all need a link to edge-a, in a class of `subnet`.
fn three_pairs(subnet: &str) -> Cluster {
    let mut c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .node("w1", "100.64.0.2")
        .node("w2", "100.64.0.3")
        .node("w3", "100.64.0.4")
        .namespace("games", json!({}))
        .class_json("public", vxlan_with(subnet, 4242, 4790), Value::Null)
        .row("public", "edge-a", json!({"wt0": "100.64.0.1"}), 1400);
    for (i, w) in ["w1", "w2", "w3"].iter().enumerate() {
        let name = format!("gs{i}");
        c = c
            .endpoint(
                "games",
                &name,
                "p",
                w,
                &format!("10.244.{i}.5"),
                3000 + i as i32,
            )
            .portmap(pm("games", &name, "public", 3000 + i as i32));
    }
    c
}

#[test]
fn slots_go_lowest_free_first_in_key_order_and_each_pod_node_proposes_its_own() {
    let c = three_pairs("169.254.77.0/24").claim("public", "edge-a/w2", 0);
    let proposals: Vec<(String, String, u32)> = ["edge-a", "w1", "w2", "w3"]
        .iter()
        .flat_map(|n| {
            c.plan(n)
                .writes
                .claims
                .into_iter()
                .map(move |p| ((*n).to_owned(), p.key, p.slot))
        })
        .collect();
    assert_eq!(
        proposals,
        [
            ("w1".into(), "edge-a/w1".into(), 1),
            ("w3".into(), "edge-a/w3".into(), 2)
        ],
        "slot 0 is held by edge-a/w2; the others take 1 and 2 in key order, each proposed by its pod node"
    );
}

#[test]
fn exhausted_subnet_stops_new_pairs_only() {
    // A /30 holds two /31s: edge-a/w2 keeps its claim, edge-a/w1 gets the other, w3 gets none.
    let c = three_pairs("169.254.77.0/30").claim_built("public", "edge-a/w2", 0);
    let plan = c.plan("w3");
    let (reason, msg) = ready(&plan, "public");
    assert_eq!(reason, C::SubnetExhausted);
    assert_eq!(
        msg,
        "no /31 is free in 169.254.77.0/30 for node pair edge-a/w3"
    );
    assert!(plan.writes.claims.is_empty());
    let p = decision(&plan, "games", "gs2")
        .programmed
        .clone()
        .expect("programmed");
    assert_eq!(p.reason, P::ReturnPathUnavailable);
    assert!(
        p.message.contains("no /31 is free in 169.254.77.0/30"),
        "{}",
        p.message
    );
    // No other agent's step is pending: the status is written at once, never held back.
    let writes = c.plan("edge-a").writes.portmaps;
    let gs2 = writes
        .iter()
        .find(|w| w.name == "gs2")
        .expect("edge-a writes gs2");
    assert!(!gs2.settling);
    // The landed pair keeps working.
    let edge = c.plan("edge-a");
    assert_eq!(edge.host_state.links.len(), 1);
    assert_eq!(
        decision(&edge, "games", "gs1")
            .programmed
            .as_ref()
            .map(|p| p.reason),
        Some(P::AllNodesReady)
    );
}

#[test]
fn garbage_collection_marks_clears_and_drops() {
    let c = three_pairs("169.254.77.0/24")
        .claim("public", "edge-a/w1", 0)
        .claim_unused_since("public", "edge-a/w2", 1, "2026-06-01T00:00:00Z")
        .claim("public", "edge-a/w9", 2)
        .claim_unused_since("public", "edge-a/w8", 3, "2026-05-31T11:59:00Z")
        .claim_unused_since("public", "edge-a/w7", 4, "2026-05-31T12:01:00Z");
    let gc: Vec<(String, GcKind)> = c
        .plan("edge-a")
        .writes
        .gc
        .into_iter()
        .map(|g| (g.key, g.action))
        .collect();
    assert_eq!(
        gc,
        [
            ("edge-a/w2".into(), GcKind::ClearUnused),
            ("edge-a/w8".into(), GcKind::Drop),
            ("edge-a/w9".into(), GcKind::MarkUnused),
        ],
        "w1 is needed and clean; w7 is unused for less than 24h"
    );
    assert!(
        c.plan("w1").writes.gc.is_empty(),
        "only accepting nodes collect"
    );
    let view = c
        .plan("edge-a")
        .classes
        .into_iter()
        .find(|c| c.name == "public")
        .expect("class");
    let keys: Vec<&str> = view.links.iter().map(|l| l.key.as_str()).collect();
    assert!(
        !keys.contains(&"edge-a/w8"),
        "a dropped claim leaves the view: {keys:?}"
    );
    assert_eq!(
        view.links
            .iter()
            .find(|l| l.key == "edge-a/w9")
            .and_then(|l| l.unused_since),
        Some(now())
    );
}

#[test]
fn malformed_claims_are_ignored() {
    let c = three_pairs("169.254.77.0/24")
        .claim("public", "w1/edge-a", 0)
        .claim("public", "edge-a/w1", 300)
        .claim("public", "edge-a/w2", 5)
        .claim("public", "edge-a/w3", 5);
    let plan = c.plan("w3");
    let view = plan
        .classes
        .iter()
        .find(|c| c.name == "public")
        .expect("class");
    let landed: Vec<(&str, u32)> = view
        .links
        .iter()
        .filter(|l| l.landed)
        .map(|l| (l.key.as_str(), l.slot))
        .collect();
    assert_eq!(
        landed,
        [("edge-a/w2", 5)],
        "unsorted key, out-of-range slot and a duplicate slot are ignored"
    );
    assert_eq!(
        plan.writes.claims.len(),
        1,
        "w3 proposes a fresh slot: {:?}",
        plan.writes.claims
    );
    assert_ne!(plan.writes.claims[0].slot, 5);
}

#[test]
fn both_ends_derive_the_same_link() {
    let c = three_pairs("169.254.77.0/24").claim("public", "edge-a/w2", 3);
    let edge = c.plan_with("edge-a", &facts(&[("wt0", "100.64.0.1")], "wt0", 1400));
    let worker = c.plan_with("w2", &facts(&[], "eth0", 1500));
    let (e, w) = (&edge.host_state.links[0], &worker.host_state.links[0]);
    assert_eq!((e.vni, w.vni), (4245, 4245), "VNI = class vni + slot");
    assert_eq!((e.port, w.port), (4790, 4790));
    assert_eq!(
        (e.local.to_string(), e.remote.to_string()),
        ("100.64.0.1".into(), "100.64.0.3".into())
    );
    assert_eq!((w.local, w.remote), (e.remote, e.local));
    assert_eq!(
        e.address.to_string(),
        "169.254.77.6/31",
        "the bytewise-lower name takes the even end"
    );
    assert_eq!(w.address.to_string(), "169.254.77.7/31");
    assert_eq!(
        e.mark,
        kuport_core::ir::MarkLayout::default()
            .link_mark(1)
            .expect("first link mark"),
        "the first link of a node takes link id 1, whatever its slot or VNI"
    );
    assert_eq!(e.name, kuport_core::plan::link_name("public", "w2"));
    assert_eq!(w.name, kuport_core::plan::link_name("public", "edge-a"));
    assert!(e.name.starts_with("kup-") && e.name.len() == 12);
    assert_eq!(e.device.as_deref(), Some("wt0"));
    assert_eq!(
        (e.ttl, e.rp_filter),
        (64, 2),
        "ttl 64, loose reverse-path filtering"
    );
    assert_eq!(e.mtu, Some(1350), "edge: own 1400, peer has no row");
    assert_eq!(
        w.mtu,
        Some(1350),
        "worker: min(own 1500, edge-a's row 1400) - 50"
    );
    let no_facts = c.plan("edge-a");
    assert_eq!(
        (
            no_facts.host_state.links[0].mtu,
            no_facts.host_state.links[0].device.clone()
        ),
        (None, None)
    );
}

/// Edges edge-a (serving) and edge-c (standby), both on wt0, in a Single class of `subnet`; a
/// pod on worker-b and, when `a_worker` is set, one on a-worker (whose name sorts before the
/// edges, so its standby pair sorts before worker-b's serving pair).
fn standby_cluster(subnet: &str, a_worker: bool) -> Cluster {
    let c = two_edges_and_worker(subnet);
    if !a_worker {
        return c;
    }
    c.node("a-worker", "100.64.0.4")
        .endpoint("games", "early", "early-0", "a-worker", "10.244.2.5", 3001)
        .portmap(pm("games", "early", "public", 3001))
}

/// Every node's proposals: (proposer, key, slot, replaces).
fn all_proposals(c: &Cluster) -> Vec<(String, String, u32, Option<String>)> {
    ["a-worker", "edge-a", "edge-c", "worker-b"]
        .iter()
        .flat_map(|n| {
            c.plan(n)
                .writes
                .claims
                .into_iter()
                .map(move |p| ((*n).to_owned(), p.key, p.slot, p.replaces))
        })
        .collect()
}

#[test]
fn the_pod_node_claims_every_standby_pair_ahead_of_need() {
    let c = standby_cluster("169.254.77.0/24", false);
    assert_eq!(
        all_proposals(&c),
        [
            ("worker-b".into(), "edge-a/worker-b".into(), 0, None),
            ("worker-b".into(), "edge-c/worker-b".into(), 1, None),
        ],
        "the serving pair and the standby pair, both proposed by the pod's node"
    );
    assert_eq!(
        ready(&c.plan("edge-a"), "public"),
        (C::Valid, String::new())
    );
}

#[test]
fn only_the_next_accepting_nodes_in_serving_order_keep_standby_links() {
    // Five accepting edges: edge-a serves, edge-b and edge-c are next; edge-d and edge-e would
    // only serve after three failures, so they hold no slot and no mark for it.
    let edges = ["edge-a", "edge-b", "edge-c", "edge-d", "edge-e"];
    let mut c = Cluster::new().node("worker-x", "100.64.0.99");
    for (i, e) in edges.iter().enumerate() {
        c = c.node(e, &format!("100.64.0.{}", i + 1));
    }
    let nodes: Vec<(&str, &[&str])> = edges.iter().map(|e| (*e, &["wt0"][..])).collect();
    c = c
        .namespace("games", json!({}))
        .class_json(
            "public",
            json!({"nodes": nodes_json(&nodes),
                   "returnPath": {"mode": "Vxlan", "vxlan": {"subnet": "169.254.77.0/24", "vni": 4242, "port": 4790}}}),
            Value::Null,
        );
    for (i, e) in edges.iter().enumerate() {
        c = c.row(
            "public",
            e,
            json!({"wt0": format!("100.64.0.{}", i + 1)}),
            1400,
        );
    }
    let c = c
        .endpoint("games", "gs", "gs-0", "worker-x", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let keys: Vec<String> = c
        .plan("worker-x")
        .writes
        .claims
        .into_iter()
        .map(|p| p.key)
        .collect();
    assert_eq!(
        keys,
        ["edge-a/worker-x", "edge-b/worker-x", "edge-c/worker-x"],
        "the serving pair and {} standby pairs",
        kuport_core::plan::STANDBY_LINKS
    );
}

fn gc_of(c: &Cluster, node: &str) -> Vec<(String, GcKind)> {
    c.plan(node)
        .writes
        .gc
        .into_iter()
        .map(|g| (g.key, g.action))
        .collect()
}

#[test]
fn standby_claims_are_never_collected() {
    let c = standby_cluster("169.254.77.0/24", false)
        .claim("public", "edge-a/worker-b", 0)
        .claim_unused_since("public", "edge-c/worker-b", 1, "2026-05-01T00:00:00Z");
    assert_eq!(
        gc_of(&c, "edge-c"),
        [("edge-c/worker-b".into(), GcKind::ClearUnused)],
        "a standby claim is needed, so it is cleared, not dropped"
    );
}

/// Each claim is looked after by one accepting node: the pair's own accepting node, else (it
/// no longer accepts) the class's first accepting node. The others leave it alone, so a pod
/// move's marks are one write, not one per accepting node.
#[test]
fn one_accepting_node_collects_each_claim() {
    let c = standby_cluster("169.254.77.0/24", false)
        .claim_unused_since("public", "edge-c/worker-b", 1, "2026-05-01T00:00:00Z")
        .claim("public", "edge-z/worker-q", 2);
    let mark = ("edge-z/worker-q".to_owned(), GcKind::MarkUnused);
    let clear = ("edge-c/worker-b".to_owned(), GcKind::ClearUnused);
    assert_eq!(gc_of(&c, "edge-a"), [mark], "edge-z accepts for no class");
    assert_eq!(gc_of(&c, "worker-b"), [], "only accepting nodes collect");
    assert_eq!(gc_of(&c, "edge-c"), [clear]);
}

#[test]
fn serving_pairs_take_free_slots_before_standby_pairs() {
    // Two slots, four pairs. In key order a-worker/edge-c (standby) would take the second slot
    // and starve edge-a/worker-b (serving).
    let c = standby_cluster("169.254.77.0/30", true);
    assert_eq!(
        all_proposals(&c),
        [
            ("a-worker".into(), "a-worker/edge-a".into(), 0, None),
            ("worker-b".into(), "edge-a/worker-b".into(), 1, None),
        ]
    );
    assert_eq!(
        ready(&c.plan("edge-a"), "public"),
        (
            C::Valid,
            "no /31 is free in 169.254.77.0/30 for standby link a-worker/edge-c and 1 more: a failover over that pair waits for a slot".into()
        ),
        "short of standby slots only, the class still works"
    );
}

#[test]
fn a_serving_pair_takes_over_a_standby_claims_slot_when_none_is_free() {
    use kuport_core::plan::merge::{RowHome, class_parts, merge_class_status};
    use kuport_core::plan::node_rows::NodeRows;
    // Both slots went to a-worker's pairs while worker-b's pod had no mapping.
    let c = standby_cluster("169.254.77.0/30", true)
        .claim_built("public", "a-worker/edge-a", 0)
        .claim_built("public", "a-worker/edge-c", 1);
    assert_eq!(
        all_proposals(&c),
        [(
            "worker-b".into(),
            "edge-a/worker-b".into(),
            1,
            Some("a-worker/edge-c".into())
        )],
        "the serving pair takes the standby pair's slot, lowest key first"
    );
    assert_eq!(ready(&c.plan("edge-a"), "public").0, C::Valid);
    // Both ends of the standby link tear it down at once, so the new link's VNI is free.
    assert!(c.plan("edge-c").host_state.links.is_empty());
    let peers: Vec<String> = c
        .plan("a-worker")
        .host_state
        .links
        .into_iter()
        .map(|l| l.peer)
        .collect();
    assert_eq!(peers, ["edge-a"]);

    // The pod node's write lands the takeover.
    let worker = c.plan("worker-b");
    let mut after = c.clone();
    let class = after.class_mut("public");
    let part = class_parts(&worker.writes, "worker-b", std::slice::from_ref(&*class))
        .remove("public")
        .expect("worker-b writes to public");
    let merged = merge_class_status(
        class,
        &NodeRows::default(),
        "worker-b",
        RowHome::Class {
            agent_version: "test",
        },
        &part,
        now(),
    );
    assert!(merged.dropped.is_empty());
    let keys: Vec<(String, i32)> = merged
        .status
        .links
        .iter()
        .map(|l| (l.key.clone(), l.slot))
        .collect();
    assert_eq!(
        keys,
        [("a-worker/edge-a".into(), 0), ("edge-a/worker-b".into(), 1)]
    );
    class.status = Some(merged.status);
    let edge = c.plan("edge-a");
    assert_eq!(
        edge.host_state.links.len(),
        1,
        "before: only a-worker's link"
    );
    let edge = after.plan("edge-a");
    assert_eq!(edge.host_state.links.len(), 2, "after: both serving links");
    assert_eq!(
        decision(&edge, "games", "gs")
            .programmed
            .as_ref()
            .map(|p| p.reason),
        Some(P::NotAcknowledged),
        "until both ends report the new link"
    );
    let after = after.link_ends("public", "edge-a/worker-b", 1, None);
    let edge = after.plan("edge-a");
    for name in ["gs", "early"] {
        assert_eq!(
            decision(&edge, "games", name)
                .programmed
                .as_ref()
                .map(|p| p.reason),
            Some(P::AllNodesReady),
            "{name}"
        );
    }
    assert!(
        all_proposals(&after).is_empty(),
        "the displaced standby pair waits for a free slot and takes none"
    );
    assert_eq!(
        ready(&edge, "public"),
        (
            C::Valid,
            "no /31 is free in 169.254.77.0/30 for standby link a-worker/edge-c and 1 more: a failover over that pair waits for a slot".into()
        )
    );
}

#[test]
fn serving_links_take_link_marks_before_standby_links() {
    use kuport_core::ir::MarkLayout;
    use kuport_core::plan::link_name;
    // Three edges; the pod node has marks for two links, and its standby links hold both ids.
    let c = Cluster::new()
        .node("edge-a", "100.64.0.1")
        .node("edge-c", "100.64.0.3")
        .node("edge-d", "100.64.0.5")
        .node("worker-b", "100.64.0.2")
        .namespace("games", json!({}))
        .class_json(
            "public",
            json!({"nodes": nodes_json(&[("edge-a", &["wt0"]), ("edge-c", &["wt0"]), ("edge-d", &["wt0"])]),
                   "returnPath": {"mode": "Vxlan"}}),
            Value::Null,
        )
        .claim_built("public", "edge-a/worker-b", 0)
        .claim_built("public", "edge-c/worker-b", 1)
        .claim_built("public", "edge-d/worker-b", 2)
        .endpoint("games", "gs", "gs-0", "worker-b", "10.244.1.5", 3000)
        .portmap(pm("games", "gs", "public", 3000));
    let mut f = facts(&[], "wt0", 1400);
    f.marks = MarkLayout { base: 1, mask: 3 };
    assert_eq!(f.marks.link_capacity(), 2);
    let peers = |f: &kuport_core::snapshot::HostFacts| -> Vec<(String, u32)> {
        let mut peers: Vec<(String, u32)> = c
            .plan_with("worker-b", f)
            .host_state
            .links
            .into_iter()
            .map(|l| (l.peer, l.mark))
            .collect();
        peers.sort();
        peers
    };
    assert_eq!(
        peers(&f),
        [("edge-a".into(), 2), ("edge-c".into(), 3)],
        "with nothing on the host, the serving link takes the first id"
    );
    f.link_ids.insert(link_name("public", "edge-c"), 1);
    f.link_ids.insert(link_name("public", "edge-d"), 2);
    assert_eq!(
        peers(&f),
        [("edge-a".into(), 2), ("edge-d".into(), 3)],
        "the serving link takes a standby link's id rather than go without"
    );
}
