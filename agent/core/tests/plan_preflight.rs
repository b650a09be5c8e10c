//! Preflight classes: a class annotated `kuport.wlz.li/preflight: "true"` needs a return link
//! between every pair of its accepting nodes without any PortMap, so the agents build, probe and
//! report each one; a class without the annotation needs none, and one past its deadline
//! (`kuport.wlz.li/preflight-deadline`) none any more.

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use kuport_core::api::{PREFLIGHT_ANNOTATION, PREFLIGHT_DEADLINE_ANNOTATION, checks};
use kuport_core::plan::{ClassReason, GcKind};
use kuport_testkit::cluster::*;
use serde_json::{Value, json};

const NODES: [&str; 4] = ["a", "b", "c", "d"];

fn four_nodes(preflight: Option<&str>) -> Cluster {
    let mut c = Cluster::new();
    for (i, n) in NODES.iter().enumerate() {
        c = c.node(n, &format!("100.64.0.{}", i + 1));
    }
    let nodes: Vec<(&str, &[&str])> = NODES.iter().map(|n| (*n, &["lo"][..])).collect();
    c = c.class_json(
        "kuport-preflight",
        json!({"nodes": nodes_json(&nodes),
               "returnPath": {"mode": "Vxlan", "vxlan": {"subnet": "169.254.112.0/20", "vni": 60000, "port": 4790}}}),
        Value::Null,
    );
    if let Some(value) = preflight {
        let annotations = c
            .class_mut("kuport-preflight")
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(PREFLIGHT_ANNOTATION.to_owned(), value.to_owned());
        // A run's deadline, five minutes after NOW.
        annotations.insert(
            PREFLIGHT_DEADLINE_ANNOTATION.to_owned(),
            "2026-06-01T12:05:00Z".to_owned(),
        );
    }
    c
}

fn pairs() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, a) in NODES.iter().enumerate() {
        for b in &NODES[i + 1..] {
            out.insert(format!("{a}/{b}"));
        }
    }
    out
}

#[test]
fn every_pair_is_proposed_once_by_its_later_node_with_the_same_slots_everywhere() {
    let c = four_nodes(Some("true"));
    let mut proposed = BTreeSet::new();
    let mut slots = BTreeSet::new();
    for node in NODES {
        let plan = c.plan(node);
        for claim in &plan.writes.claims {
            assert_eq!(claim.class, "kuport-preflight");
            assert_eq!(
                claim.peers[1], node,
                "{node} proposes only the pairs it is the later node of: {claim:?}"
            );
            assert!(proposed.insert(claim.key.clone()), "{} twice", claim.key);
            assert!(slots.insert(claim.slot), "slot {} twice", claim.slot);
        }
        assert!(
            plan.host_state.links.is_empty(),
            "no link before its claim landed"
        );
        let ready = &plan.classes[0].ready;
        assert_eq!(ready.reason, ClassReason::Valid, "{}", ready.message);
    }
    assert_eq!(proposed, pairs());
    assert_eq!(slots, (0..6).collect());
}

#[test]
fn once_the_claims_landed_every_node_builds_a_link_to_every_other() {
    let mut c = four_nodes(Some("true"));
    let proposals: Vec<(String, u32)> = NODES
        .iter()
        .flat_map(|n| c.plan(n).writes.claims)
        .map(|claim| (claim.key, claim.slot))
        .collect();
    for (key, slot) in &proposals {
        c = c.claim("kuport-preflight", key, i32::try_from(*slot).expect("slot"));
    }
    for node in NODES {
        let facts = facts(&[("lo", "127.0.0.1")], "wt0", 1420);
        let plan = c.plan_with(node, &facts);
        let peers: BTreeSet<&str> = plan
            .host_state
            .links
            .iter()
            .map(|l| l.peer.as_str())
            .collect();
        let others: BTreeSet<&str> = NODES.iter().copied().filter(|n| *n != node).collect();
        assert_eq!(peers, others, "{node}'s links");
        assert!(plan.writes.claims.is_empty(), "nothing left to propose");
        assert!(
            plan.writes.gc.is_empty(),
            "the pairs stay needed: {:?}",
            plan.writes.gc
        );
        assert!(
            plan.host_state.nft.chains.iter().all(|(_, rules)| {
                rules
                    .iter()
                    .all(|r| !matches!(r, kuport_core::ir::Rule::Dnat(_)))
            }),
            "a preflight class captures nothing"
        );
        // The row says the class is fine and carries the node's checks.
        let row = &plan.writes.class_rows[0].row;
        assert!(row.ready, "{row:?}");
        assert!(
            row.checks
                .iter()
                .any(|c| c.name == checks::CNI_OVERLAY_PORT),
            "{:?}",
            row.checks
        );
    }
}

#[test]
fn without_the_annotation_no_pair_is_needed() {
    for annotation in [None, Some("false"), Some("yes")] {
        let c = four_nodes(annotation);
        for node in NODES {
            let plan = c.plan(node);
            assert!(plan.writes.claims.is_empty(), "{annotation:?} {node}");
            assert!(plan.host_state.links.is_empty(), "{annotation:?} {node}");
        }
    }
}

#[test]
fn a_node_not_ready_is_left_out_of_the_pairs() {
    let mut c = four_nodes(Some("true"));
    c.snapshot
        .nodes
        .retain(|n| n.metadata.name.as_deref() != Some("d"));
    c = c.unready_node("d", "100.64.0.4");
    let keys: BTreeSet<String> = NODES
        .iter()
        .flat_map(|n| c.plan(n).writes.claims)
        .map(|claim| claim.key)
        .collect();
    let want: BTreeSet<String> = pairs().into_iter().filter(|k| !k.contains('d')).collect();
    assert_eq!(keys, want);
}

#[test]
fn a_rows_checks_are_the_hosts_and_the_cnis_sorted_and_bounded_to_the_schema() {
    use kuport_core::api::NodeCheck;
    use kuport_core::plan::limits;
    let c = four_nodes(Some("true")).cni_port(4790);
    let mut facts = facts(&[("lo", "127.0.0.1")], "wt0", 1420);
    facts.node_checks = (0..40)
        .map(|i| NodeCheck {
            name: format!("check{i:02}{}", "n".repeat(100)),
            ok: Some(i % 2 == 0),
            message: "m".repeat(2000),
        })
        .collect();
    let row = &c.plan_with("a", &facts).writes.class_rows[0].row;
    assert_eq!(row.checks.len(), limits::CHECKS);
    assert!(row.checks.windows(2).all(|w| w[0].name < w[1].name));
    assert!(row.checks.iter().all(|c| c.name.len() <= limits::CHECK_NAME
        && c.message.len() <= limits::CHECK_MESSAGE));

    // The CNI's overlay port is the class's link port: that check fails, in this class's row.
    facts.node_checks.clear();
    let row = &c.plan_with("a", &facts).writes.class_rows[0].row;
    let overlay = row
        .checks
        .iter()
        .find(|c| c.name == checks::CNI_OVERLAY_PORT)
        .expect("the overlay check");
    assert_eq!(overlay.ok, Some(false), "{overlay:?}");
    assert!(overlay.message.contains("4790"), "{}", overlay.message);
    let routing = row
        .checks
        .iter()
        .find(|c| c.name == checks::CNI_HOST_ROUTING)
        .expect("the host routing check");
    assert_eq!(routing.ok, Some(true), "{routing:?}");
}

#[test]
fn preflight_links_take_only_link_ids_no_other_link_holds() {
    use kuport_core::ir::MarkLayout;
    let mut c = four_nodes(Some("true"));
    let proposals: Vec<(String, u32)> = NODES
        .iter()
        .flat_map(|n| c.plan(n).writes.claims)
        .map(|claim| (claim.key, claim.slot))
        .collect();
    for (key, slot) in &proposals {
        c = c.claim("kuport-preflight", key, i32::try_from(*slot).expect("slot"));
    }
    // Room for two link ids, one of them held by a link of some other class on the host.
    let mut facts = facts(&[("lo", "127.0.0.1")], "wt0", 1420);
    facts.marks = MarkLayout { base: 1, mask: 3 };
    facts.link_ids.insert("kup-0123abcd".to_owned(), 1);
    let plan = c.plan_with("a", &facts);
    let held = facts.marks.link_mark(1).expect("id 1 has a mark");
    assert_eq!(
        plan.host_state.links.len(),
        1,
        "{:?}",
        plan.host_state.links
    );
    assert!(
        plan.host_state.links.iter().all(|l| l.mark != held),
        "a preflight link never takes the id another link holds"
    );
}

/// The four-node preflight class with the claims it proposed while live landed, and then the
/// deadline `deadline`.
fn landed_with_deadline(deadline: &str) -> Cluster {
    let mut c = four_nodes(Some("true"));
    let proposals: Vec<(String, u32)> = NODES
        .iter()
        .flat_map(|n| c.plan(n).writes.claims)
        .map(|claim| (claim.key, claim.slot))
        .collect();
    assert_eq!(proposals.len(), 6, "a live class proposes every pair");
    for (key, slot) in &proposals {
        c = c.claim("kuport-preflight", key, i32::try_from(*slot).expect("slot"));
    }
    c.class_mut("kuport-preflight")
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            PREFLIGHT_DEADLINE_ANNOTATION.to_owned(),
            deadline.to_owned(),
        );
    c
}

#[test]
fn a_class_past_its_deadline_builds_no_link_and_says_it_expired_on_every_node() {
    let facts = facts(&[("lo", "127.0.0.1")], "wt0", 1420);
    let at = |t: &str| -> Timestamp { t.parse().expect("a time") };
    // NOW is 12:00:00. Control: a deadline 30 s ago still lies inside the minute allowed for
    // clock skew, so the links stay; the plan changes when that minute ends.
    let live = landed_with_deadline("2026-06-01T11:59:30Z");
    for node in NODES {
        let plan = live.plan_with(node, &facts);
        assert_eq!(
            plan.host_state.links.len(),
            3,
            "{node}: a link to each peer"
        );
        assert_eq!(plan.classes[0].ready.reason, ClassReason::Valid);
        assert_eq!(plan.changes_at, Some(at("2026-06-01T12:00:30Z")));
    }
    // Past the allowance: no node builds a link, proposes a claim or clears a mark; the
    // collector of each claim marks it unused; the class says why, in the same words
    // everywhere.
    let expired = landed_with_deadline("2026-06-01T11:58:59Z");
    let mut messages = BTreeSet::new();
    let mut marked = BTreeSet::new();
    for node in NODES {
        let plan = expired.plan_with(node, &facts);
        assert!(plan.host_state.links.is_empty(), "{node}: no link");
        assert!(plan.writes.claims.is_empty(), "{node}: no claim");
        assert_eq!(plan.changes_at, None, "nothing more changes by time");
        let ready = &plan.classes[0].ready;
        assert_eq!(ready.reason, ClassReason::PreflightExpired);
        messages.insert(ready.message.clone());
        for gc in &plan.writes.gc {
            assert_eq!(gc.action, GcKind::MarkUnused, "{gc:?}");
            assert!(marked.insert(gc.key.clone()), "{} marked twice", gc.key);
        }
        let row = &plan.writes.class_rows[0];
        assert!(row.row.links.is_empty(), "{node}'s row reports no link");
        assert_eq!(row.ready.reason, "PreflightExpired");
    }
    assert_eq!(marked, pairs(), "every claim is marked unused once");
    assert_eq!(messages.len(), 1, "{messages:?}");
    let message = messages.into_iter().next().expect("a message");
    assert!(
        message.contains(
            "its deadline 2026-06-01T11:58:59Z (kuport.wlz.li/preflight-deadline) has passed"
        ),
        "{message}"
    );
}

#[test]
fn an_expired_preflight_class_holds_no_subnet_against_a_later_class() {
    // A class created after the preflight class, on the same subnet and VNIs: overlapping
    // while the preflight class lives, free once it expired.
    let later = |deadline: &str| {
        let mut c = landed_with_deadline(deadline);
        c.class_mut("kuport-preflight").metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-06-01T11:00:00Z".parse().expect("a time"),
            ));
        c = c.class_json(
            "public",
            json!({"nodes": nodes_json(&[("a", &["lo"][..]), ("b", &["lo"][..])]),
                   "returnPath": {"mode": "Vxlan", "vxlan": {"subnet": "169.254.112.0/24", "vni": 60000, "port": 4790}}}),
            Value::Null,
        );
        c.class_mut("public").metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-06-01T11:30:00Z".parse().expect("a time"),
            ));
        let plan = c.plan("a");
        plan.classes
            .iter()
            .find(|d| d.name == "public")
            .expect("the class")
            .ready
            .reason
    };
    assert_eq!(
        later("2026-06-01T12:30:00Z"),
        ClassReason::ReturnPathOverlap
    );
    assert_eq!(later("2026-06-01T11:30:00Z"), ClassReason::Valid);
}
