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
use super::node_rows::{LAST_PASS_REFRESH_SECONDS, NodeRows, keep_round_trips};
use super::state::valid_claims;
use super::{
    CLAIM_GC_AFTER_SECONDS, ClaimProposal, ClassRowWrite, GcAction, GcKind, KernelRefusalWrite,
    Writes,
};
use crate::api::{
    ClassNodeStatus, LinkClaim, PortMapClass, PortMapClassStatus, PortMapStatus, RefusedMapping,
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
/// nothing that belongs to another node. This node's row is not written here: it lives in the
/// node's own `PortMapNode` (`node_rows::node_spec`), and a row this node left in the class
/// status (written by an earlier version) is removed. What an accepting node computes from
/// every row (`readyNodes`, the summary) reads the rows that count (`node_rows`), with this
/// node's row as it is about to write it. The class's spec is read too: which link entries
/// count as claims depends on its subnet and VNI, exactly as in the plan.
pub fn merge_class_status(
    class: &PortMapClass,
    node_rows: &NodeRows<'_>,
    node: &str,
    home: RowHome<'_>,
    part: &ClassPart<'_>,
    now: Timestamp,
) -> ClassMerge {
    let stored = class.status.clone().unwrap_or_default();
    let mut status = stored.clone();
    match (home, part.row) {
        (RowHome::Class { agent_version }, Some(write)) => {
            merge_row(&mut status, node, agent_version, write, now);
        }
        // No row, or a row that lives in the node's own object: none of this node's stays here.
        _ => status.nodes.retain(|n| n.name != node),
    }
    let ready_flipped = part.row.and_then(|write| merge_ready(&mut status, write));
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
        Some(write) if accepts(write) => {
            let mut rows = node_rows.rows_of(class);
            rows.retain(|r| r.name != node);
            let at = rows.partition_point(|r| r.name.as_str() < node);
            rows.insert(at, &write.row);
            summarise(&stored, &mut status, &rows, write)
        }
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

/// Where a node writes its row of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowHome<'a> {
    /// Into the class status, stamped with the version of the agent writing (which is not
    /// necessarily this crate's): what every agent did before `PortMapNode`, and the default
    /// while a rollout may still run agents that read rows only there.
    Class {
        /// The version stamped into the row.
        agent_version: &'a str,
    },
    /// Into the node's own `PortMapNode` (`node_rows::node_spec`); a row it left in the class
    /// status goes.
    Node,
}

/// This node's row, replaced in place or inserted in name order. Its pass time is `now` unless
/// the stored one is recent and from the same version, which then stands with its links' round
/// trips (they change on every probe): a converged pass writes nothing.
fn merge_row(
    status: &mut PortMapClassStatus,
    node: &str,
    agent_version: &str,
    write: &ClassRowWrite,
    now: Timestamp,
) {
    let mut new_row = write.row.clone();
    new_row.agent_version = Some(agent_version.to_owned());
    match status.nodes.iter_mut().find(|n| n.name == node) {
        Some(row) => {
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
}

/// The class's Ready condition as this node computes it, when it is an accepting node's.
/// Returns the condition when its status flipped (or it first appeared).
fn merge_ready(status: &mut PortMapClassStatus, write: &ClassRowWrite) -> Option<Condition> {
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
    rows: &[&ClassNodeStatus],
    write: &ClassRowWrite,
) -> (Vec<(String, String)>, Vec<String>) {
    let ready: Vec<String> = rows
        .iter()
        .filter(|n| n.ready && write.accepting.binary_search(&n.name).is_ok())
        .map(|n| n.name.clone())
        .collect();
    let mut nodes_left = Vec::new();
    for gone in stored.ready_nodes.iter().filter(|n| !ready.contains(n)) {
        let row = rows.iter().find(|r| &r.name == gone);
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
pub(super) mod tests;
