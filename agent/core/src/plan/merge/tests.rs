//! The merge's tests (the row patch's tests share their builders).

use kuport_testkit::cluster::{ready_condition as cond, timestamp as ts};

use super::*;
use crate::api::{LinkEndStatus, NodeClassRow, PortMapNode, PortMapNodeSpec};

/// The version a test agent stamps into its rows.
const VERSION: &str = "1.2.3";

/// A ready row of `node` and nothing else (the row patch tests use it too).
pub(in crate::plan) fn row(node: &str) -> ClassNodeStatus {
    ClassNodeStatus {
        name: node.into(),
        ready: true,
        ..Default::default()
    }
}

/// The claim of pair `key` ("a/b") at `slot` of the default link subnet.
pub(in crate::plan) fn link(key: &str, slot: i32) -> LinkClaim {
    LinkClaim {
        key: key.into(),
        peers: key.split('/').map(str::to_owned).collect(),
        subnet: format!("169.254.77.{}/31", slot * 2),
        slot,
        unused_since: None,
    }
}

fn proposal(key: &str, slot: u32) -> ClaimProposal {
    let (a, b) = key.split_once('/').expect("key");
    ClaimProposal {
        class: "public".into(),
        key: key.into(),
        peers: [a.into(), b.into()],
        slot,
        subnet: format!("169.254.77.{}/31", slot * 2),
        replaces: None,
    }
}

const NOW: &str = "2026-01-02T00:00:00Z";

/// Merges into the status of a class `public` with the default subnet (128 slots).
fn merge_status(
    stored: &PortMapClassStatus,
    node: &str,
    part: &ClassPart<'_>,
    now: Timestamp,
) -> ClassMerge {
    let rows = NodeRows::default();
    let class = class("public", stored.clone());
    merge_class_status(&class, &rows, node, RowHome::Node, part, now)
}

/// [`merge_status`] by an agent that writes its row into the class status.
fn merge_in_class(
    stored: &PortMapClassStatus,
    node: &str,
    version: &str,
    part: &ClassPart<'_>,
    now: Timestamp,
) -> ClassMerge {
    let rows = NodeRows::default();
    let class = class("public", stored.clone());
    let home = RowHome::Class {
        agent_version: version,
    };
    merge_class_status(&class, &rows, node, home, part, now)
}

/// A Vxlan class with the default subnet (128 slots) and `status`.
fn class(name: &str, status: PortMapClassStatus) -> PortMapClass {
    let mut class: PortMapClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"nodes": {"n1": {"interfaces": ["wt0"]}}, "returnPath": {"mode": "Vxlan"}},
    }))
    .expect("class deserialises");
    class.status = Some(status);
    class
}

#[test]
fn own_row_leaves_the_class_and_others_are_untouched() {
    let mut other = row("a-node");
    other.message = Some("interface wt0 not present".into());
    let stored = PortMapClassStatus {
        nodes: vec![other.clone(), row("m-node"), row("z-node")],
        ..Default::default()
    };
    let write = ClassRowWrite {
        class: "public".into(),
        row: row("m-node"),
        ready: cond("True", "Valid", NOW),
        accepting: vec!["a-node".into(), "m-node".into(), "z-node".into()],
        named: 3,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let merged = merge_status(&stored, "m-node", &part, ts(NOW));
    let names: Vec<&str> = merged
        .status
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(names, ["a-node", "z-node"]);
    assert_eq!(merged.status.nodes[0], other);
    assert_eq!(merged.status.ready_nodes, ["a-node", "m-node", "z-node"]);
    assert_eq!(
        merged.ready_flipped.map(|c| c.reason),
        Some("Valid".to_owned())
    );
}

#[test]
fn own_refusals_replace_this_nodes_entries_and_leave_the_others() {
    let entry = |node: &str, mapping: &str| RefusedMapping {
        node: node.into(),
        mapping: mapping.into(),
        message: format!("refused on {node}"),
    };
    let stored = PortMapClassStatus {
        refused: vec![entry("a", "games/x"), entry("b", "games/old")],
        ..Default::default()
    };
    let write = KernelRefusalWrite {
        class: "public".into(),
        mapping: "games/new".into(),
        message: "refused on b".into(),
    };
    let part = ClassPart {
        refused: vec![&write],
        ..Default::default()
    };
    let merged = merge_status(&stored, "b", &part, ts(NOW));
    assert_eq!(
        merged.status.refused,
        [entry("a", "games/x"), entry("b", "games/new")]
    );
    // Nothing refused any more: this node's entries go, the other node's stay.
    let merged = merge_status(&merged.status, "b", &ClassPart::default(), ts(NOW));
    assert_eq!(merged.status.refused, [entry("a", "games/x")]);
}

/// A row as this agent writes it, last stamped at `at`.
fn stamped(node: &str, at: &str) -> ClassNodeStatus {
    ClassNodeStatus {
        agent_version: Some(VERSION.to_owned()),
        last_pass_time: Some(Time(ts(at))),
        ..row(node)
    }
}

#[test]
fn ready_is_rewritten_only_when_it_differs() {
    let stored = PortMapClassStatus {
        conditions: vec![cond("True", "Valid", "2026-01-01T00:00:00Z")],
        ready_nodes: vec!["n1".into()],
        nodes_summary: Some("1/1 n1".into()),
        ..Default::default()
    };
    // Same condition but a different lastTransitionTime precision: nothing to write.
    let write = ClassRowWrite {
        class: "public".into(),
        row: row("n1"),
        ready: cond("True", "Valid", "2026-01-01T00:00:00.5Z"),
        accepting: vec!["n1".into()],
        named: 1,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let merged = merge_status(&stored, "n1", &part, ts(NOW));
    assert_eq!(merged.status, stored);
    assert_eq!(merged.ready_flipped, None);
    // A reason change without a flip is written, but is no flip.
    let write = ClassRowWrite {
        ready: cond("True", "Other", "2026-01-01T00:00:00Z"),
        ..write
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let merged = merge_status(&stored, "n1", &part, ts(NOW));
    assert_eq!(merged.status.conditions[0].reason, "Other");
    assert_eq!(merged.ready_flipped, None);
}

#[test]
fn a_pod_nodes_row_leaves_the_condition_and_ready_nodes_alone() {
    let stored = PortMapClassStatus {
        conditions: vec![cond("True", "Valid", NOW)],
        nodes: vec![stamped("n1", NOW)],
        ready_nodes: vec!["n1".into()],
        nodes_summary: Some("1/1 n1".into()),
        ..Default::default()
    };
    let mut pod_row = row("w1");
    pod_row.accepting = Some(false);
    pod_row.links = vec![LinkEndStatus {
        peer: "n1".into(),
        slot: 0,
        ..Default::default()
    }];
    let write = ClassRowWrite {
        class: "public".into(),
        row: pod_row,
        // What a pod's node computes of the condition is never written.
        ready: cond("False", "SubnetExhausted", NOW),
        accepting: Vec::new(),
        named: 1,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let merged = merge_status(&stored, "w1", &part, ts(NOW));
    assert_eq!(merged.status.conditions, stored.conditions);
    assert_eq!(merged.status.ready_nodes, ["n1"]);
    assert_eq!(merged.status.nodes_summary.as_deref(), Some("1/1 n1"));
    assert_eq!((merged.ready_flipped, merged.nodes_left.len()), (None, 0));
    let names: Vec<&str> = merged
        .status
        .nodes
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["n1"], "a pod node's row lives in its own object");
}

#[test]
fn ready_nodes_and_the_summary_follow_rows_and_node_readiness() {
    let mut down = stamped("n2", NOW);
    down.ready = false;
    down.message = Some("interface wt0 not present".into());
    let stored = PortMapClassStatus {
        nodes: vec![stamped("n1", NOW), stamped("n2", NOW), stamped("n3", NOW)],
        ready_nodes: vec!["n1".into(), "n2".into(), "n3".into()],
        nodes_summary: Some("3/3 n1,n2,n3".into()),
        ..Default::default()
    };
    // n1 writes that its own row is fine; n2's row went not ready meanwhile (fresh read)
    // and n3's Node is not Ready in n1's snapshot.
    let mut fresh = stored.clone();
    fresh.nodes[1] = down;
    let write = ClassRowWrite {
        class: "public".into(),
        row: row("n1"),
        ready: cond("True", "Valid", NOW),
        accepting: vec!["n1".into(), "n2".into()],
        named: 3,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let merged = merge_status(&fresh, "n1", &part, ts(NOW));
    assert_eq!(merged.status.ready_nodes, ["n1"]);
    assert_eq!(merged.status.nodes_summary.as_deref(), Some("1/3 n1"));
    assert_eq!(
        merged.nodes_left,
        [
            ("n2".to_owned(), "interface wt0 not present".to_owned()),
            (
                "n3".to_owned(),
                "its Node is not Ready or no longer exists".to_owned()
            ),
        ]
    );
    assert!(merged.nodes_joined.is_empty());
    // Written once, the next pass finds nothing to report.
    let again = merge_status(&merged.status, "n1", &part, ts(NOW));
    assert_eq!(again.status, merged.status);
    assert!(again.nodes_left.is_empty() && again.nodes_joined.is_empty());
    // n3 comes back.
    let write = ClassRowWrite {
        accepting: vec!["n1".into(), "n2".into(), "n3".into()],
        ..write
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let back = merge_status(&merged.status, "n1", &part, ts(NOW));
    assert_eq!(back.status.nodes_summary.as_deref(), Some("2/3 n1,n3"));
    assert_eq!(back.nodes_joined, ["n3"]);
}

#[test]
fn own_row_is_inserted_in_order_and_others_are_untouched() {
    let mut other = row("a-node");
    other.message = Some("interface wt0 not present".into());
    let stored = PortMapClassStatus {
        nodes: vec![other.clone(), row("z-node")],
        ..Default::default()
    };
    let write = ClassRowWrite {
        class: "public".into(),
        row: row("m-node"),
        ready: cond("True", "Valid", NOW),
        accepting: vec!["a-node".into(), "m-node".into(), "z-node".into()],
        named: 3,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let merged = merge_in_class(&stored, "m-node", VERSION, &part, ts(NOW));
    let names: Vec<&str> = merged
        .status
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(names, ["a-node", "m-node", "z-node"]);
    assert_eq!(merged.status.nodes[0], other);
    assert_eq!(
        merged.ready_flipped.map(|c| c.reason),
        Some("Valid".to_owned())
    );
}

#[test]
fn the_pass_time_is_refreshed_once_a_minute_and_on_a_new_version() {
    let write = ClassRowWrite {
        class: "public".into(),
        row: row("n1"),
        ready: cond("True", "Valid", "2026-01-01T00:00:00Z"),
        accepting: vec!["n1".into()],
        named: 1,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let status = |row: ClassNodeStatus| PortMapClassStatus {
        conditions: vec![cond("True", "Valid", "2026-01-01T00:00:00Z")],
        nodes: vec![row],
        ready_nodes: vec!["n1".into()],
        nodes_summary: Some("1/1 n1".into()),
        ..Default::default()
    };
    let recent = status(stamped("n1", "2026-01-01T23:59:01Z"));
    assert_eq!(
        merge_in_class(&recent, "n1", VERSION, &part, ts(NOW)).status,
        recent
    );
    let old = status(stamped("n1", "2026-01-01T23:59:00Z"));
    assert_eq!(
        merge_in_class(&old, "n1", VERSION, &part, ts(NOW)).status,
        status(stamped("n1", NOW))
    );
    let mut other_version = stamped("n1", "2026-01-01T23:59:30Z");
    other_version.agent_version = Some("0.0.0-old".into());
    assert_eq!(
        merge_in_class(&status(other_version), "n1", VERSION, &part, ts(NOW)).status,
        status(stamped("n1", NOW))
    );
}

#[test]
fn a_round_trip_alone_is_not_written_until_the_pass_time_is_due() {
    let end = |rtt| LinkEndStatus {
        peer: "w1".into(),
        slot: 0,
        up: Some(true),
        rtt_microseconds: Some(rtt),
        ..Default::default()
    };
    let mut stored_row = stamped("n1", "2026-01-01T23:59:30Z");
    stored_row.links = vec![end(800)];
    let stored = PortMapClassStatus {
        conditions: vec![cond("True", "Valid", "2026-01-01T00:00:00Z")],
        nodes: vec![stored_row],
        ready_nodes: vec!["n1".into()],
        nodes_summary: Some("1/1 n1".into()),
        ..Default::default()
    };
    let mut new_row = row("n1");
    new_row.links = vec![end(950)];
    let write = ClassRowWrite {
        class: "public".into(),
        row: new_row,
        ready: cond("True", "Valid", "2026-01-01T00:00:00Z"),
        accepting: vec!["n1".into()],
        named: 1,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    assert_eq!(
        merge_in_class(&stored, "n1", VERSION, &part, ts(NOW)).status,
        stored,
        "30 s after the last refresh, only the round trip differs: nothing to write"
    );
    let later = ts("2026-01-02T00:01:00Z");
    let merged = merge_in_class(&stored, "n1", VERSION, &part, later);
    assert_eq!(merged.status.nodes[0].links[0].rtt_microseconds, Some(950));
}

#[test]
fn ready_nodes_read_the_rows_of_the_nodes_own_objects() {
    // n2 left a ready row in the class before its upgrade; its own object says not ready.
    let stored = PortMapClassStatus {
        nodes: vec![stamped("n2", NOW), stamped("n3", NOW)],
        ready_nodes: vec!["n1".into(), "n2".into(), "n3".into()],
        ..Default::default()
    };
    let mut down = row("n2");
    down.ready = false;
    down.message = Some("interface wt0 not present".into());
    let objects = [PortMapNode::new(
        "n2",
        PortMapNodeSpec {
            agent_version: Some(VERSION.into()),
            classes: vec![NodeClassRow {
                class: "public".into(),
                row: down,
            }],
        },
    )];
    let write = ClassRowWrite {
        class: "public".into(),
        row: row("n1"),
        ready: cond("True", "Valid", NOW),
        accepting: vec!["n1".into(), "n2".into(), "n3".into()],
        named: 3,
        namespaces: Vec::new(),
    };
    let part = ClassPart {
        row: Some(&write),
        ..Default::default()
    };
    let class = class("public", stored);
    let rows = NodeRows::new(&objects);
    let merged = merge_class_status(&class, &rows, "n1", RowHome::Node, &part, ts(NOW));
    assert_eq!(merged.status.ready_nodes, ["n1", "n3"]);
    assert_eq!(
        merged.nodes_left,
        [("n2".to_owned(), "interface wt0 not present".to_owned())]
    );
    // The legacy rows stay as stored: only their own agents remove them.
    assert_eq!(merged.status.nodes.len(), 2);
    // Without the object, n2's legacy row counts.
    let none = NodeRows::default();
    let legacy = merge_class_status(&class, &none, "n1", RowHome::Node, &part, ts(NOW));
    assert_eq!(legacy.status.ready_nodes, ["n1", "n2", "n3"]);
}

#[test]
fn a_node_that_no_longer_accepts_removes_only_its_own_row() {
    let stored = PortMapClassStatus {
        nodes: vec![row("n1"), row("n2")],
        ..Default::default()
    };
    let merged = merge_status(&stored, "n1", &ClassPart::default(), ts(NOW));
    assert_eq!(merged.status.nodes, vec![row("n2")]);
}

#[test]
fn parts_cover_every_class_written_and_every_stale_row_once() {
    let stored = [
        class(
            "gone",
            PortMapClassStatus {
                nodes: vec![row("n1")],
                ..Default::default()
            },
        ),
        class(
            "others",
            PortMapClassStatus {
                nodes: vec![row("n2")],
                ..Default::default()
            },
        ),
        class(
            "public",
            PortMapClassStatus {
                nodes: vec![row("n1")],
                ..Default::default()
            },
        ),
    ];
    let writes = Writes {
        class_rows: vec![ClassRowWrite {
            class: "public".into(),
            row: row("n1"),
            ready: cond("True", "Valid", NOW),
            accepting: vec!["n1".into()],
            named: 1,
            namespaces: Vec::new(),
        }],
        claims: vec![proposal("n1/n2", 0)],
        refusals: vec![KernelRefusalWrite {
            class: "lan".into(),
            mapping: "games/gs".into(),
            message: "refused".into(),
        }],
        ..Default::default()
    };
    let parts = class_parts(&writes, "n1", &stored);
    let names: Vec<&str> = parts.keys().map(String::as_str).collect();
    assert_eq!(names, ["gone", "lan", "public"]);
    let public = &parts["public"];
    assert!(public.row.is_some() && public.claims.len() == 1 && public.refused.is_empty());
    let gone = &parts["gone"];
    assert!(
        gone.row.is_none() && gone.claims.is_empty() && gone.gc.is_empty(),
        "a class the node no longer writes gets an empty part, which removes its row"
    );
    assert_eq!(parts["lan"].refused.len(), 1);
}

#[test]
fn a_proposal_lands_only_on_a_free_slot() {
    let stored = PortMapClassStatus {
        links: vec![link("n1/n3", 0)],
        ..Default::default()
    };
    let (taken, free, landed) = (
        proposal("n1/n2", 0),
        proposal("n1/n4", 1),
        proposal("n1/n3", 5),
    );
    let part = ClassPart {
        claims: vec![&taken, &free, &landed],
        ..Default::default()
    };
    let merged = merge_status(&stored, "n2", &part, ts(NOW));
    assert_eq!(merged.dropped, ["n1/n2"]);
    assert_eq!(
        merged.status.links,
        vec![link("n1/n3", 0), link("n1/n4", 1)]
    );
}

#[test]
fn entries_the_plan_ignores_give_way_to_its_proposals() {
    // What the plan reads past: a slot beyond the subnet's 128 (left by a larger subnet), a
    // key that is not a sorted pair, and the later key of two on one slot. It proposes fresh
    // slots for those pairs, and before the merge read claims as the plan does, these
    // entries refused the proposals on every pass: the pairs never got a link.
    let stored = PortMapClassStatus {
        links: vec![
            link("n1/n2", 200),
            link("n1/n3", 0),
            link("n1/n4", 0),
            link("n5/n5", 2),
        ],
        ..Default::default()
    };
    let (beyond, lost, on_malformed) = (
        proposal("n1/n2", 1),
        proposal("n1/n4", 3),
        proposal("n1/n6", 2),
    );
    let part = ClassPart {
        claims: vec![&beyond, &lost, &on_malformed],
        ..Default::default()
    };
    let merged = merge_status(&stored, "n2", &part, ts(NOW));
    assert!(merged.dropped.is_empty(), "{:?}", merged.dropped);
    assert_eq!(
        merged.status.links,
        vec![
            link("n1/n2", 1),
            link("n1/n3", 0),
            link("n1/n4", 3),
            link("n1/n6", 2)
        ],
        "each pair holds its new slot, and no slot is held twice"
    );
}

#[test]
fn a_takeover_lands_only_while_the_named_standby_claim_holds_the_slot() {
    let stored = PortMapClassStatus {
        links: vec![link("n1/n3", 0), link("n2/n3", 1)],
        ..Default::default()
    };
    let mut takeover = proposal("n1/n2", 1);
    takeover.replaces = Some("n2/n3".into());
    let part = ClassPart {
        claims: vec![&takeover],
        ..Default::default()
    };
    let merged = merge_status(&stored, "n2", &part, ts(NOW));
    assert!(merged.dropped.is_empty());
    assert_eq!(
        merged.status.links,
        vec![link("n1/n2", 1), link("n1/n3", 0)]
    );
    // Another pair landed on the slot meanwhile: the takeover is not for it.
    let mut wrong = proposal("n1/n2", 0);
    wrong.replaces = Some("n2/n3".into());
    let part = ClassPart {
        claims: vec![&wrong],
        ..Default::default()
    };
    let merged = merge_status(&stored, "n2", &part, ts(NOW));
    assert_eq!(merged.dropped, ["n1/n2"]);
    assert_eq!(merged.status.links, stored.links);
}

#[test]
fn a_proposal_beyond_the_fresh_subnet_is_dropped() {
    // The class shrank to a /30 (2 slots) between the plan and the write.
    let mut small = class("public", PortMapClassStatus::default());
    small.spec.return_path.vxlan.subnet = "169.254.77.0/30".into();
    let (fits, beyond) = (proposal("n1/n2", 1), proposal("n1/n3", 2));
    let part = ClassPart {
        claims: vec![&fits, &beyond],
        ..Default::default()
    };
    let merged = merge_class_status(
        &small,
        &NodeRows::default(),
        "n2",
        RowHome::Node,
        &part,
        ts(NOW),
    );
    assert_eq!(merged.dropped, ["n1/n3"]);
    assert_eq!(merged.status.links, vec![link("n1/n2", 1)]);
}

#[test]
fn gc_marks_clears_and_drops_only_what_expired_on_the_fresh_object() {
    let mut old = link("a/b", 0);
    old.unused_since = Some(Time(ts("2025-12-30T00:00:00Z")));
    let mut recent = link("a/c", 1);
    recent.unused_since = Some(Time(ts("2026-01-01T12:00:00Z")));
    let mut needed = link("a/d", 2);
    needed.unused_since = Some(Time(ts("2026-01-01T00:00:00Z")));
    let stored = PortMapClassStatus {
        links: vec![old, recent.clone(), needed, link("a/e", 3)],
        ..Default::default()
    };
    let gc = |key: &str, action| GcAction {
        class: "public".into(),
        key: key.into(),
        action,
    };
    let actions = [
        gc("a/b", GcKind::Drop),
        gc("a/c", GcKind::Drop),
        gc("a/d", GcKind::ClearUnused),
        gc("a/e", GcKind::MarkUnused),
    ];
    let part = ClassPart {
        gc: actions.iter().collect(),
        ..Default::default()
    };
    let merged = merge_status(&stored, "a", &part, ts(NOW));
    let mut marked = link("a/e", 3);
    marked.unused_since = Some(Time(ts(NOW)));
    assert_eq!(merged.status.links, vec![recent, link("a/d", 2), marked]);
}

#[test]
fn portmap_equivalence_ignores_only_transition_times_and_order() {
    let status = |reason: &str, at: &str| PortMapStatus {
        observed_generation: Some(1),
        conditions: vec![
            Condition {
                type_: "Accepted".into(),
                ..cond("True", "Valid", at)
            },
            Condition {
                type_: "Programmed".into(),
                ..cond("True", reason, at)
            },
        ],
        ..Default::default()
    };
    let a = status("AllNodesReady", "2026-01-01T00:00:00Z");
    let mut b = status("AllNodesReady", "2026-01-01T00:00:00.25Z");
    b.conditions.reverse();
    assert!(portmap_status_equivalent(&a, &b));
    assert!(!portmap_status_equivalent(
        &a,
        &status("NodesNotReady", "2026-01-01T00:00:00Z")
    ));
    let mut stale = a.clone();
    stale.conditions.push(Condition {
        type_: "Stale".into(),
        ..cond("True", "Old", NOW)
    });
    assert!(
        !portmap_status_equivalent(&a, &stale),
        "a stale condition must go"
    );
}
