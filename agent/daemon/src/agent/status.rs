//! Writing the status this node owns (agent.md, "Status writes").
//!
//! PortMap statuses are replaced whole, with the `resourceVersion` of the object the plan was
//! computed from: a 409 means the plan read a stale object, so the pass is re-run on fresher
//! inputs rather than the body replayed. Class statuses are shared by every accepting node, so
//! this node merges only its own part (its row, its link proposals, its GC actions, the Ready
//! condition when it differs) into a freshly read object and writes it with compare-and-swap,
//! re-reading and re-merging on 409.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kuport_core::api::{
    LinkClaim, PortMap, PortMapClass, PortMapClassStatus, PortMapStatus, RefusedMapping, conditions,
};
use kuport_core::plan::{AcceptedReason, PortMapWrite, RefusalWrite, Writes};
use kuport_core::plan::{CLAIM_GC_AFTER_SECONDS, ClaimProposal, ClassRowWrite, GcAction, GcKind};

use super::events::{EventSink, PendingEvent};

/// Event reason on a PortMapClass when a node leaves its ready nodes (a Warning).
pub const NODE_LEFT_REASON: &str = "NodeNotReady";
/// Event reason on a PortMapClass when a node joins its ready nodes.
pub const NODE_JOINED_REASON: &str = "NodeReady";
/// Every Event reason the agent writes that is not a condition reason.
pub const CLASS_EVENT_REASONS: [&str; 2] = [NODE_LEFT_REASON, NODE_JOINED_REASON];
use super::metrics::{Metrics, WriteKind, WriteResult};

/// How many times one class write re-reads and re-merges after a 409 within one pass.
const CLASS_CAS_ATTEMPTS: usize = 5;

/// What the status writes of one pass came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusOutcome {
    /// Writes the API server accepted.
    pub written: usize,
    /// Writes skipped because the stored status already says the same.
    pub unchanged: usize,
    /// Writes that must be recomputed from fresher inputs (409 on a PortMap, a class that kept
    /// conflicting, a link proposal whose slot another pair took).
    pub recompute: usize,
    /// Writes that failed for another reason, each naming the object and the operation.
    pub errors: Vec<String>,
}

/// The status writer of one agent.
pub(crate) struct StatusWriter<'a> {
    pub client: &'a kube::Client,
    pub node: &'a str,
    pub metrics: &'a Arc<Metrics>,
    pub events: &'a EventSink,
    pub api_timeout: Duration,
}

impl StatusWriter<'_> {
    /// Writes everything in `writes`; one failed write never stops the others.
    pub async fn write_all(
        &self,
        writes: &Writes,
        portmaps: &Store<PortMap>,
        classes: &[PortMapClass],
        now: Timestamp,
    ) -> StatusOutcome {
        let mut outcome = StatusOutcome::default();
        for w in &writes.portmaps {
            self.write_portmap(w, portmaps, &mut outcome).await;
        }
        // Every class this node has something to say about: its row (accepting nodes), its
        // proposals, its GC, or a stale row of its own to remove.
        let mut names: Vec<&str> = writes
            .class_rows
            .iter()
            .map(|r| r.class.as_str())
            .chain(writes.claims.iter().map(|c| c.class.as_str()))
            .chain(writes.gc.iter().map(|g| g.class.as_str()))
            .chain(writes.refusals.iter().map(|r| r.class.as_str()))
            .chain(
                classes
                    .iter()
                    .filter(|c| {
                        c.status.as_ref().is_some_and(|s| {
                            s.nodes.iter().any(|n| n.name == self.node)
                                || s.refused.iter().any(|r| r.node == self.node)
                        })
                    })
                    .map(|c| c.metadata.name.as_deref().unwrap_or_default()),
            )
            .filter(|n| !n.is_empty())
            .collect();
        names.sort_unstable();
        names.dedup();
        for class in names {
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
            // When merging into the watched copy changes nothing, the fresh object is not read:
            // a converged pass costs no request. Anything to change is merged into a fresh read.
            let watched = classes
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(class))
                .map(|c| c.status.clone().unwrap_or_default());
            if let Some(watched) = watched {
                let merged = merge_class_status(&watched, self.node, &part, now);
                if merged.status == watched && merged.dropped.is_empty() {
                    outcome.unchanged += 1;
                    continue;
                }
            }
            self.write_class(class, &part, now, &mut outcome).await;
        }
        outcome
    }

    async fn write_portmap(
        &self,
        w: &PortMapWrite,
        store: &Store<PortMap>,
        outcome: &mut StatusOutcome,
    ) {
        let what = format!("PortMap {}/{}", w.namespace, w.name);
        let Some(current) = store.get(&ObjectRef::new(&w.name).within(&w.namespace)) else {
            // Deleted since the snapshot: nothing to write.
            outcome.unchanged += 1;
            return;
        };
        let stored = current.status.clone().unwrap_or_default();
        if portmap_status_equivalent(&stored, &w.status) {
            outcome.unchanged += 1;
            return;
        }
        let mut body = (*current).clone();
        body.metadata.managed_fields = None;
        body.status = Some(w.status.clone());
        let api: Api<PortMap> = Api::namespaced(self.client.clone(), &w.namespace);
        let result = tokio::time::timeout(
            self.api_timeout,
            api.replace_status(&w.name, &PostParams::default(), &body),
        )
        .await;
        match result {
            Ok(Ok(_)) => {
                self.metrics
                    .record_write(WriteKind::PortMap, WriteResult::Written);
                outcome.written += 1;
                tracing::debug!("wrote the status of {what}");
                for type_ in [conditions::ACCEPTED, conditions::PROGRAMMED] {
                    if let Some(c) = to_report(&stored.conditions, &w.status.conditions, type_) {
                        self.events.emit(PendingEvent {
                            regarding: current.object_ref(&()),
                            warning: is_warning(c),
                            reason: c.reason.clone(),
                            note: note(type_, c),
                            action: "UpdateStatus",
                        });
                    }
                }
            }
            Ok(Err(kube::Error::Api(s))) if s.is_conflict() => {
                self.metrics
                    .record_write(WriteKind::PortMap, WriteResult::Conflict);
                outcome.recompute += 1;
                tracing::debug!("writing the status of {what}: 409, recomputing");
            }
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() => {
                outcome.unchanged += 1;
            }
            Ok(Err(e)) => {
                self.metrics
                    .record_write(WriteKind::PortMap, WriteResult::Failed);
                outcome
                    .errors
                    .push(format!("writing the status of {what}: {e}"));
            }
            Err(_) => {
                self.metrics
                    .record_write(WriteKind::PortMap, WriteResult::Failed);
                outcome.errors.push(format!(
                    "writing the status of {what}: no answer within {:?}",
                    self.api_timeout
                ));
            }
        }
    }

    /// Reads the class fresh, merges this node's part, writes with compare-and-swap, and on a
    /// 409 re-reads and re-merges (up to 5 times). Long because the retry loop, its timeouts
    /// and the outcome accounting of each attempt belong together.
    async fn write_class(
        &self,
        class: &str,
        part: &ClassPart<'_>,
        now: Timestamp,
        outcome: &mut StatusOutcome,
    ) {
        let what = format!("PortMapClass {class}");
        let api: Api<PortMapClass> = Api::all(self.client.clone());
        for _ in 0..CLASS_CAS_ATTEMPTS {
            let fresh = match tokio::time::timeout(self.api_timeout, api.get_opt(class)).await {
                Ok(Ok(Some(fresh))) => fresh,
                Ok(Ok(None)) => {
                    outcome.unchanged += 1;
                    return;
                }
                Ok(Err(e)) => {
                    outcome.errors.push(format!("reading {what}: {e}"));
                    return;
                }
                Err(_) => {
                    outcome.errors.push(format!(
                        "reading {what}: no answer within {:?}",
                        self.api_timeout
                    ));
                    return;
                }
            };
            let stored = fresh.status.clone().unwrap_or_default();
            let merged = merge_class_status(&stored, self.node, part, now);
            if !merged.dropped.is_empty() {
                tracing::debug!(
                    "{what}: link proposal(s) {} dropped: the slot was taken meanwhile",
                    merged.dropped.join(", ")
                );
                outcome.recompute += 1;
            }
            if merged.status == stored {
                outcome.unchanged += 1;
                return;
            }
            let mut body = fresh.clone();
            body.metadata.managed_fields = None;
            body.status = Some(merged.status);
            let result = tokio::time::timeout(
                self.api_timeout,
                api.replace_status(class, &PostParams::default(), &body),
            )
            .await;
            match result {
                Ok(Ok(_)) => {
                    self.metrics
                        .record_write(WriteKind::Class, WriteResult::Written);
                    outcome.written += 1;
                    tracing::debug!("wrote this node's part of the status of {what}");
                    if let Some(c) = merged.ready_flipped {
                        self.events.emit(PendingEvent {
                            regarding: fresh.object_ref(&()),
                            warning: c.status != conditions::TRUE,
                            reason: c.reason.clone(),
                            note: note(conditions::READY, &c),
                            action: "UpdateStatus",
                        });
                    }
                    for (node, why) in &merged.nodes_left {
                        self.events.emit(PendingEvent {
                            regarding: fresh.object_ref(&()),
                            warning: true,
                            reason: NODE_LEFT_REASON.to_owned(),
                            note: format!("node {node} no longer accepts for the class: {why}"),
                            action: "UpdateStatus",
                        });
                    }
                    for node in &merged.nodes_joined {
                        self.events.emit(PendingEvent {
                            regarding: fresh.object_ref(&()),
                            warning: false,
                            reason: NODE_JOINED_REASON.to_owned(),
                            note: format!("node {node} accepts for the class"),
                            action: "UpdateStatus",
                        });
                    }
                    return;
                }
                Ok(Err(kube::Error::Api(s))) if s.is_conflict() => {
                    // Someone else wrote meanwhile: re-read and re-merge, never replay.
                    self.metrics
                        .record_write(WriteKind::Class, WriteResult::Conflict);
                    continue;
                }
                Ok(Err(kube::Error::Api(s))) if s.is_not_found() => {
                    outcome.unchanged += 1;
                    return;
                }
                Ok(Err(e)) => {
                    self.metrics
                        .record_write(WriteKind::Class, WriteResult::Failed);
                    outcome
                        .errors
                        .push(format!("writing the status of {what}: {e}"));
                    return;
                }
                Err(_) => {
                    self.metrics
                        .record_write(WriteKind::Class, WriteResult::Failed);
                    outcome.errors.push(format!(
                        "writing the status of {what}: no answer within {:?}",
                        self.api_timeout
                    ));
                    return;
                }
            }
        }
        // Still conflicting after several fresh reads: let the next pass try again.
        outcome.recompute += 1;
    }
}

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
    pub refused: Vec<&'a RefusalWrite>,
}

/// The result of merging one node's part into a class status.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassMerge {
    /// The status to write.
    pub status: PortMapClassStatus,
    /// Keys of proposals dropped because another pair holds their slot.
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

/// Merges this node's part into `stored`, touching nothing that belongs to another node.
pub fn merge_class_status(
    stored: &PortMapClassStatus,
    node: &str,
    part: &ClassPart<'_>,
    now: Timestamp,
) -> ClassMerge {
    let mut status = stored.clone();
    let ready_flipped = match part.row {
        Some(write) => merge_row(&mut status, node, write, now),
        // This node no longer accepts for the class: its row goes.
        None => {
            status.nodes.retain(|n| n.name != node);
            None
        }
    };
    let dropped = land_claims(&mut status, &part.claims);
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
        Some(write) => summarise(stored, &mut status, write),
        None => (Vec::new(), Vec::new()),
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
    write: &ClassRowWrite,
    now: Timestamp,
) -> Option<Condition> {
    let mut new_row = write.row.clone();
    new_row.agent_version = Some(env!("CARGO_PKG_VERSION").to_owned());
    match status.nodes.iter_mut().find(|n| n.name == node) {
        Some(row) => {
            // The stored pass time stands while it is recent and the version is the same: a
            // converged pass writes nothing.
            new_row.last_pass_time = row
                .last_pass_time
                .clone()
                .filter(|t| {
                    row.agent_version == new_row.agent_version
                        && (0..LAST_PASS_REFRESH_SECONDS)
                            .contains(&(now.as_second() - t.0.as_second()))
                })
                .or(Some(Time(now)));
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

/// Lands proposals on slots still free in the fresh object, in key order; returns the keys of
/// those dropped because another pair holds their slot.
fn land_claims(status: &mut PortMapClassStatus, claims: &[&ClaimProposal]) -> Vec<String> {
    let mut dropped = Vec::new();
    for claim in claims {
        if status.links.iter().any(|l| l.key == claim.key) {
            // Another writer landed the pair already; its slot is the one that counts.
            continue;
        }
        let taken = status
            .links
            .iter()
            .any(|l| u32::try_from(l.slot).ok() == Some(claim.slot));
        let slot = match (taken, i32::try_from(claim.slot)) {
            (false, Ok(slot)) => slot,
            _ => {
                dropped.push(claim.key.clone());
                continue;
            }
        };
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
    status.nodes_summary = Some(kuport_core::summary::class_nodes_summary(
        write.named,
        &ready,
    ));
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

/// An Event's note for a condition: `Programmed is False: <message>`, or without the colon
/// when the condition has no message (success reasons).
fn note(type_: &str, c: &Condition) -> String {
    if c.message.is_empty() {
        format!("{type_} is {} ({})", c.status, c.reason)
    } else {
        format!("{type_} is {}: {}", c.status, c.message)
    }
}

/// The new condition of `type_` when it is worth an Event: it is new, its status flipped, or
/// it stays False for another reason (a different problem for the user to act on). A steady
/// condition, or a True one whose reason or message changed, is not.
/// Events for false conditions are warnings, and so is the one true reason that reports a
/// clash.
fn is_warning(c: &Condition) -> bool {
    c.status != conditions::TRUE || c.reason == AcceptedReason::PortAlsoHeldByHost.as_str()
}

fn to_report<'a>(stored: &[Condition], new: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    let new = new.iter().find(|c| c.type_ == type_)?;
    let old = stored.iter().find(|c| c.type_ == type_);
    // A changed reason is news even when the status holds: a refusal with another cause, or an
    // accepted mapping whose port a host socket now also wants.
    old.is_none_or(|o| o.status != new.status || o.reason != new.reason)
        .then_some(new)
}

#[cfg(test)]
mod tests {
    use kuport_core::api::ClassNodeStatus;

    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn cond(status: &str, reason: &str, at: &str) -> Condition {
        Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{reason}."),
            last_transition_time: Time(ts(at)),
            observed_generation: Some(1),
        }
    }

    fn row(node: &str) -> ClassNodeStatus {
        ClassNodeStatus {
            name: node.into(),
            ready: true,
            ..Default::default()
        }
    }

    fn link(key: &str, slot: i32) -> LinkClaim {
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
        }
    }

    const NOW: &str = "2026-01-02T00:00:00Z";

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
        };
        let part = ClassPart {
            row: Some(&write),
            ..Default::default()
        };
        let merged = merge_class_status(&stored, "m-node", &part, ts(NOW));
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
        let write = RefusalWrite {
            class: "public".into(),
            mapping: "games/new".into(),
            message: "refused on b".into(),
        };
        let part = ClassPart {
            refused: vec![&write],
            ..Default::default()
        };
        let merged = merge_class_status(&stored, "b", &part, ts(NOW));
        assert_eq!(
            merged.status.refused,
            [entry("a", "games/x"), entry("b", "games/new")]
        );
        // Nothing refused any more: this node's entries go, the other node's stay.
        let merged = merge_class_status(&merged.status, "b", &ClassPart::default(), ts(NOW));
        assert_eq!(merged.status.refused, [entry("a", "games/x")]);
    }

    /// A row as this agent writes it, last stamped at `at`.
    fn stamped(node: &str, at: &str) -> ClassNodeStatus {
        ClassNodeStatus {
            agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
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
        };
        let part = ClassPart {
            row: Some(&write),
            ..Default::default()
        };
        let merged = merge_class_status(&stored, "n1", &part, ts(NOW));
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
        let merged = merge_class_status(&stored, "n1", &part, ts(NOW));
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
            merge_class_status(&recent, "n1", &part, ts(NOW)).status,
            recent
        );
        let old = status(stamped("n1", "2026-01-01T23:59:00Z"));
        assert_eq!(
            merge_class_status(&old, "n1", &part, ts(NOW)).status,
            status(stamped("n1", NOW))
        );
        let mut other_version = stamped("n1", "2026-01-01T23:59:30Z");
        other_version.agent_version = Some("0.0.0-old".into());
        assert_eq!(
            merge_class_status(&status(other_version), "n1", &part, ts(NOW)).status,
            status(stamped("n1", NOW))
        );
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
        };
        let part = ClassPart {
            row: Some(&write),
            ..Default::default()
        };
        let merged = merge_class_status(&fresh, "n1", &part, ts(NOW));
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
        let again = merge_class_status(&merged.status, "n1", &part, ts(NOW));
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
        let back = merge_class_status(&merged.status, "n1", &part, ts(NOW));
        assert_eq!(back.status.nodes_summary.as_deref(), Some("2/3 n1,n3"));
        assert_eq!(back.nodes_joined, ["n3"]);
    }

    #[test]
    fn events_report_flips_and_new_refusals_but_not_steady_conditions() {
        let c = |status: &str, reason: &str| Condition {
            type_: "Programmed".into(),
            ..cond(status, reason, NOW)
        };
        let report = |old: &[Condition], new: &Condition| {
            to_report(old, std::slice::from_ref(new), "Programmed").is_some()
        };
        assert!(report(&[], &c("True", "AllNodesReady")), "new");
        assert!(report(
            &[c("True", "AllNodesReady")],
            &c("False", "NoReadyEndpoint")
        ));
        assert!(report(
            &[c("False", "NoReadyEndpoint")],
            &c("True", "AllNodesReady")
        ));
        assert!(
            report(
                &[c("False", "NodeNotReady")],
                &c("False", "NoReadyEndpoint")
            ),
            "another problem to act on"
        );
        assert!(!report(
            &[c("False", "NoReadyEndpoint")],
            &c("False", "NoReadyEndpoint")
        ));
        assert!(!report(
            &[c("True", "AllNodesReady")],
            &c("True", "AllNodesReady")
        ));
        let accepted = |reason: &str| Condition {
            type_: "Accepted".into(),
            ..cond("True", reason, NOW)
        };
        assert!(
            to_report(
                &[accepted("Valid")],
                &[accepted("PortAlsoHeldByHost")],
                "Accepted"
            )
            .is_some_and(is_warning),
            "a host socket now clashes with an accepted mapping: a warning Event"
        );
        assert!(!is_warning(&accepted("Valid")));
    }

    #[test]
    fn a_node_that_no_longer_accepts_removes_only_its_own_row() {
        let stored = PortMapClassStatus {
            nodes: vec![row("n1"), row("n2")],
            ..Default::default()
        };
        let merged = merge_class_status(&stored, "n1", &ClassPart::default(), ts(NOW));
        assert_eq!(merged.status.nodes, vec![row("n2")]);
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
        let merged = merge_class_status(&stored, "n2", &part, ts(NOW));
        assert_eq!(merged.dropped, ["n1/n2"]);
        assert_eq!(
            merged.status.links,
            vec![link("n1/n3", 0), link("n1/n4", 1)]
        );
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
        let merged = merge_class_status(&stored, "a", &part, ts(NOW));
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
