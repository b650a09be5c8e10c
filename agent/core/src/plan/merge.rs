//! Merging one node's writes into the statuses stored in the API server: the part of the agent's
//! status writes that decides what to write, apart from the requests that write it.
//!
//! PortMap statuses are replaced whole by their one writer, so all there is to decide is whether
//! the stored status already says the same. Class statuses are shared by every accepting node, so
//! a node merges only its own part (its row, its link proposals, its GC actions, its refusals,
//! the Ready condition when it differs) into the object as read, touching nothing another node
//! owns. The agent runs this merge on every fresh read of a compare-and-swap loop; the property
//! tests (and a simulator) run the same code, so what they check is what the agents write.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::classes::usable_slots;
use super::state::valid_claims;
use super::{
    CLAIM_GC_AFTER_SECONDS, ClaimProposal, ClassRowWrite, GcAction, GcKind, KernelRefusalWrite,
    Writes,
};
use crate::api::{
    LinkClaim, LinkEndStatus, PortMapClass, PortMapClassStatus, PortMapStatus, RefusedMapping,
    conditions,
};

/// This node's part of one class's status.
#[derive(Clone, Debug, Default)]
pub struct ClassPart<'a> {
    /// Its row and the Ready condition as it computes it (accepting nodes only).
    pub row: Option<&'a ClassRowWrite>,
    /// Its new link proposals.
    pub claims: Vec<&'a ClaimProposal>,
    /// Its GC actions.
    pub gc: Vec<&'a GcAction>,
    /// What its kernel refused of the class's mappings (replacing its earlier entries).
    pub refused: Vec<&'a KernelRefusalWrite>,
}

/// The result of merging one node's part into a class status.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassMerge {
    /// The status to write.
    pub status: PortMapClassStatus,
    /// Keys of proposals dropped because another pair holds their slot, or the class as read no
    /// longer has it.
    pub dropped: Vec<String>,
    /// The Ready condition when its status flipped (or first appeared).
    pub ready_flipped: Option<Condition>,
    /// Nodes that left `readyNodes` with this write, each with why.
    pub nodes_left: Vec<(String, String)>,
    /// Nodes that joined `readyNodes` with this write.
    pub nodes_joined: Vec<String>,
}

/// How often an agent refreshes its row's `lastPassTime` when nothing else in the row changed:
/// often enough to tell a stopped agent, rarely enough that a quiet cluster costs about one
/// write per node and class a minute at most (passes happen on changes and at every resync).
pub const LAST_PASS_REFRESH_SECONDS: i64 = 60;

/// The part of each class `node` has something to say about, by class name: its row (accepting
/// nodes), its proposals, its GC, its refusals, or (in `classes`, the statuses as last read) a
/// row or refusals of its own that must go because it has nothing more to say.
pub fn class_parts<'a>(
    writes: &'a Writes,
    node: &str,
    classes: &[PortMapClass],
) -> BTreeMap<String, ClassPart<'a>> {
    let stale = classes.iter().filter(|c| {
        c.status.as_ref().is_some_and(|s| {
            s.nodes.iter().any(|n| n.name == node) || s.refused.iter().any(|r| r.node == node)
        })
    });
    let names = writes
        .class_rows
        .iter()
        .map(|r| r.class.as_str())
        .chain(writes.claims.iter().map(|c| c.class.as_str()))
        .chain(writes.gc.iter().map(|g| g.class.as_str()))
        .chain(writes.refusals.iter().map(|r| r.class.as_str()))
        .chain(stale.map(|c| c.metadata.name.as_deref().unwrap_or_default()))
        .filter(|n| !n.is_empty());
    let mut parts = BTreeMap::new();
    for class in names {
        if parts.contains_key(class) {
            continue;
        }
        let part = ClassPart {
            row: writes.class_rows.iter().find(|r| r.class == class),
            claims: writes.claims.iter().filter(|c| c.class == class).collect(),
            gc: writes.gc.iter().filter(|g| g.class == class).collect(),
            refused: writes
                .refusals
                .iter()
                .filter(|r| r.class == class)
                .collect(),
        };
        parts.insert(class.to_owned(), part);
    }
    parts
}

/// Merges the part of `node` into the status of `class` (as read from the API server), touching
/// nothing that belongs to another node. Its row is stamped with `agent_version` (the version
/// of the agent writing, which is not necessarily this crate's) and, when due, with `now` as its
/// pass time. The class's spec is read too: which link entries count as claims depends on its
/// subnet and VNI, exactly as in the plan.
pub fn merge_class_status(
    class: &PortMapClass,
    node: &str,
    agent_version: &str,
    part: &ClassPart<'_>,
    now: Timestamp,
) -> ClassMerge {
    let stored = class.status.clone().unwrap_or_default();
    let mut status = stored.clone();
    let ready_flipped = match part.row {
        Some(write) => merge_row(&mut status, node, agent_version, write, now),
        // This node no longer accepts for the class: its row goes.
        None => {
            status.nodes.retain(|n| n.name != node);
            None
        }
    };
    let dropped = land_claims(&mut status, usable_slots(class), &part.claims);
    collect_claims(&mut status, &part.gc, now);
    // This node's refusals replace the entries it wrote before; other nodes' stay.
    status.refused.retain(|r| r.node != node);
    status
        .refused
        .extend(part.refused.iter().map(|r| RefusedMapping {
            node: node.to_owned(),
            mapping: r.mapping.clone(),
            message: r.message.clone(),
        }));
    status.refused.sort();
    status.refused.dedup();
    let (nodes_left, nodes_joined) = match part.row {
        Some(write) if accepts(write) => summarise(&stored, &mut status, write),
        _ => (Vec::new(), Vec::new()),
    };
    ClassMerge {
        status,
        dropped,
        ready_flipped,
        nodes_left,
        nodes_joined,
    }
}

/// This node's row, replaced in place or inserted in name order, and the class's Ready
/// condition as this node computes it. Returns the condition when its status flipped (or it
/// first appeared).
fn merge_row(
    status: &mut PortMapClassStatus,
    node: &str,
    agent_version: &str,
    write: &ClassRowWrite,
    now: Timestamp,
) -> Option<Condition> {
    let mut new_row = write.row.clone();
    new_row.agent_version = Some(agent_version.to_owned());
    match status.nodes.iter_mut().find(|n| n.name == node) {
        Some(row) => {
            // The stored pass time stands while it is recent and the version is the same: a
            // converged pass writes nothing.
            let kept = row.last_pass_time.clone().filter(|t| {
                row.agent_version == new_row.agent_version
                    && (0..LAST_PASS_REFRESH_SECONDS).contains(&(now.as_second() - t.0.as_second()))
            });
            if kept.is_some() {
                keep_round_trips(&row.links, &mut new_row.links);
            }
            new_row.last_pass_time = kept.or(Some(Time(now)));
            *row = new_row;
        }
        None => {
            new_row.last_pass_time = Some(Time(now));
            let at = status
                .nodes
                .iter()
                .position(|n| n.name.as_str() > node)
                .unwrap_or(status.nodes.len());
            status.nodes.insert(at, new_row);
        }
    }
    if !accepts(write) {
        return None;
    }
    let current = status
        .conditions
        .iter()
        .position(|c| c.type_ == conditions::READY);
    let differs =
        current.is_none_or(|i| !condition_equivalent(&status.conditions[i], &write.ready));
    if !differs {
        return None;
    }
    let flipped = current
        .is_none_or(|i| status.conditions[i].status != write.ready.status)
        .then(|| write.ready.clone());
    match current {
        Some(i) => status.conditions[i] = write.ready.clone(),
        None => status.conditions.push(write.ready.clone()),
    }
    status.observed_generation = write.ready.observed_generation;
    flipped
}

/// Whether the row is an accepting node's (a pod's node's row says nothing of the class's
/// readiness).
fn accepts(write: &ClassRowWrite) -> bool {
    write.row.accepting != Some(false)
}

/// Round trips change on every probe: between refreshes of the pass time the stored ones
/// stand, so a row whose links only changed their round trip is not written again.
fn keep_round_trips(stored: &[LinkEndStatus], links: &mut [LinkEndStatus]) {
    for link in links.iter_mut() {
        if let Some(old) = stored.iter().find(|o| o.peer == link.peer) {
            link.rtt_microseconds = old.rtt_microseconds;
        }
    }
}

/// Lands proposals on slots still free in the fresh object (or held by the standby claim the
/// proposal replaces), in key order; returns the keys of those dropped because another pair
/// holds their slot (or the slot left the usable range).
///
/// "Holds" is read as the plan reads claims (`valid_claims`): the plan proposes a fresh slot for
/// a pair whose entry it ignores (a slot out of range, say after the subnet shrank, or one
/// lost to another key) and may propose a slot that only ignored entries sit on (a malformed
/// key). Those entries give way to the proposal, which would otherwise be refused on every pass
/// and leave the pair without a link for good; removing them keeps every slot held at most once.
fn land_claims(
    status: &mut PortMapClassStatus,
    usable_slots: u32,
    claims: &[&ClaimProposal],
) -> Vec<String> {
    let mut dropped = Vec::new();
    for claim in claims {
        // Read afresh for each proposal: the ones landed before it hold their slots too.
        let held = valid_claims(&status.links, usable_slots);
        if held.contains_key(claim.key.as_str()) {
            // Another writer landed the pair already; its slot is the one that counts.
            continue;
        }
        // A serving pair may take over the slot of the standby claim its plan named, but only
        // while that claim (not some other pair that landed meanwhile) still holds it.
        let holder = held
            .iter()
            .find(|(_, c)| c.slot == claim.slot)
            .map(|(k, _)| k);
        let free = claim.slot < usable_slots
            && holder.is_none_or(|k| claim.replaces.as_deref() == Some(k.as_str()));
        let slot = match (free, i32::try_from(claim.slot)) {
            (true, Ok(slot)) => slot,
            _ => {
                dropped.push(claim.key.clone());
                continue;
            }
        };
        status
            .links
            .retain(|l| l.key != claim.key && l.slot != slot);
        let at = status
            .links
            .iter()
            .position(|l| l.key > claim.key)
            .unwrap_or(status.links.len());
        status.links.insert(
            at,
            LinkClaim {
                key: claim.key.clone(),
                peers: claim.peers.to_vec(),
                subnet: claim.subnet.clone(),
                slot,
                unused_since: None,
            },
        );
    }
    dropped
}

/// Garbage collection of claims, re-checked on the fresh object.
fn collect_claims(status: &mut PortMapClassStatus, gc: &[&GcAction], now: Timestamp) {
    for action in gc {
        let Some(i) = status.links.iter().position(|l| l.key == action.key) else {
            continue;
        };
        match action.action {
            GcKind::MarkUnused => {
                if status.links[i].unused_since.is_none() {
                    status.links[i].unused_since = Some(Time(now));
                }
            }
            GcKind::ClearUnused => status.links[i].unused_since = None,
            GcKind::Drop => {
                // Someone may have cleared it meanwhile.
                let expired = status.links[i]
                    .unused_since
                    .as_ref()
                    .is_some_and(|t| now.as_second() - t.0.as_second() > CLAIM_GC_AFTER_SECONDS);
                if expired {
                    status.links.remove(i);
                }
            }
        }
    }
}

/// `readyNodes` and `nodesSummary` from the merged rows and this pass's accepting nodes (every
/// accepting agent computes them alike from the same object and snapshot, so they settle after
/// one write). Returns the nodes that left, each with why, and those that joined.
fn summarise(
    stored: &PortMapClassStatus,
    status: &mut PortMapClassStatus,
    write: &ClassRowWrite,
) -> (Vec<(String, String)>, Vec<String>) {
    let ready: Vec<String> = status
        .nodes
        .iter()
        .filter(|n| n.ready && write.accepting.binary_search(&n.name).is_ok())
        .map(|n| n.name.clone())
        .collect();
    let mut nodes_left = Vec::new();
    for gone in stored.ready_nodes.iter().filter(|n| !ready.contains(n)) {
        let row = status.nodes.iter().find(|r| &r.name == gone);
        let why = match row {
            None => "its agent removed its row (the class no longer names it)".to_owned(),
            Some(r) if !r.ready => r
                .message
                .clone()
                .unwrap_or_else(|| "its row is not ready".to_owned()),
            Some(_) => "its Node is not Ready or no longer exists".to_owned(),
        };
        nodes_left.push((gone.clone(), why));
    }
    let nodes_joined = ready
        .iter()
        .filter(|n| !stored.ready_nodes.contains(n))
        .cloned()
        .collect();
    status.namespaces.clone_from(&write.namespaces);
    status.nodes_summary = Some(crate::summary::class_nodes_summary(write.named, &ready));
    status.ready_nodes = ready;
    (nodes_left, nodes_joined)
}

/// Equal except for `lastTransitionTime` (the plan keeps it unless the condition flipped, and
/// the API server may store it at a coarser precision than the agent's clock).
pub fn condition_equivalent(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

/// Two PortMap statuses that say the same thing, condition by condition, in any order.
pub fn portmap_status_equivalent(a: &PortMapStatus, b: &PortMapStatus) -> bool {
    let conditions = |s: &PortMapStatus| -> BTreeMap<String, Condition> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.clone()))
            .collect()
    };
    let (ca, cb) = (conditions(a), conditions(b));
    a.observed_generation == b.observed_generation
        && a.endpoint == b.endpoint
        && a.published == b.published
        && a.published_summary == b.published_summary
        && ca.len() == cb.len()
        && ca
            .iter()
            .all(|(t, c)| cb.get(t).is_some_and(|d| condition_equivalent(c, d)))
}

#[cfg(test)]
pub(super) mod tests {
    use kuport_testkit::cluster::{ready_condition as cond, timestamp as ts};

    use super::*;
    use crate::api::ClassNodeStatus;

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
        version: &str,
        part: &ClassPart<'_>,
        now: Timestamp,
    ) -> ClassMerge {
        merge_class_status(&class("public", stored.clone()), node, version, part, now)
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
        let merged = merge_status(&stored, "m-node", VERSION, &part, ts(NOW));
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
        let merged = merge_status(&stored, "b", VERSION, &part, ts(NOW));
        assert_eq!(
            merged.status.refused,
            [entry("a", "games/x"), entry("b", "games/new")]
        );
        // Nothing refused any more: this node's entries go, the other node's stay.
        let merged = merge_status(&merged.status, "b", VERSION, &ClassPart::default(), ts(NOW));
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
            nodes: vec![stamped("n1", "2026-01-01T23:59:30Z")],
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
        let merged = merge_status(&stored, "n1", VERSION, &part, ts(NOW));
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
        let merged = merge_status(&stored, "n1", VERSION, &part, ts(NOW));
        assert_eq!(merged.status.conditions[0].reason, "Other");
        assert_eq!(merged.ready_flipped, None);
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
            merge_status(&recent, "n1", VERSION, &part, ts(NOW)).status,
            recent
        );
        let old = status(stamped("n1", "2026-01-01T23:59:00Z"));
        assert_eq!(
            merge_status(&old, "n1", VERSION, &part, ts(NOW)).status,
            status(stamped("n1", NOW))
        );
        let mut other_version = stamped("n1", "2026-01-01T23:59:30Z");
        other_version.agent_version = Some("0.0.0-old".into());
        assert_eq!(
            merge_status(&status(other_version), "n1", VERSION, &part, ts(NOW)).status,
            status(stamped("n1", NOW))
        );
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
        let merged = merge_status(&stored, "w1", VERSION, &part, ts(NOW));
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
        assert_eq!(names, ["n1", "w1"]);
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
            merge_status(&stored, "n1", VERSION, &part, ts(NOW)).status,
            stored,
            "30 s after the last refresh, only the round trip differs: nothing to write"
        );
        let later = ts("2026-01-02T00:01:00Z");
        let merged = merge_status(&stored, "n1", VERSION, &part, later);
        assert_eq!(merged.status.nodes[0].links[0].rtt_microseconds, Some(950));
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
        let merged = merge_status(&fresh, "n1", VERSION, &part, ts(NOW));
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
        let again = merge_status(&merged.status, "n1", VERSION, &part, ts(NOW));
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
        let back = merge_status(&merged.status, "n1", VERSION, &part, ts(NOW));
        assert_eq!(back.status.nodes_summary.as_deref(), Some("2/3 n1,n3"));
        assert_eq!(back.nodes_joined, ["n3"]);
    }

    #[test]
    fn a_node_that_no_longer_accepts_removes_only_its_own_row() {
        let stored = PortMapClassStatus {
            nodes: vec![row("n1"), row("n2")],
            ..Default::default()
        };
        let merged = merge_status(&stored, "n1", VERSION, &ClassPart::default(), ts(NOW));
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
        let merged = merge_status(&stored, "n2", VERSION, &part, ts(NOW));
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
        let merged = merge_status(&stored, "n2", VERSION, &part, ts(NOW));
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
        let merged = merge_status(&stored, "n2", VERSION, &part, ts(NOW));
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
        let merged = merge_status(&stored, "n2", VERSION, &part, ts(NOW));
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
        let merged = merge_class_status(&small, "n2", VERSION, &part, ts(NOW));
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
        let merged = merge_status(&stored, "a", VERSION, &part, ts(NOW));
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
}
