//! What a run records as it goes: the agents' decisions pass by pass (checked for agreement as
//! they are recorded) and every invariant violation found. The world holds these; the checks
//! (`check`) and the agents' pass hooks fill them.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use kuport_core::keys::NodePair;
use kuport_core::plan::{Plan, PortMapWrite};
use kuport_core::snapshot::Snapshot;

/// One broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Simulated time it was seen.
    pub at: Duration,
    /// Which invariant.
    pub invariant: &'static str,
    /// What was seen, naming the objects.
    pub detail: String,
}

/// Every violation of one run.
#[derive(Debug, Default)]
pub struct Violations {
    /// In the order seen.
    pub found: Vec<Violation>,
    /// Class rows per class on the previous step (to see one vanish).
    pub(crate) rows: BTreeMap<String, BTreeSet<String>>,
}

impl Violations {
    /// Records a violation seen at `at`, once per invariant and detail.
    pub(crate) fn push(&mut self, at: Duration, invariant: &'static str, detail: String) {
        // One of each kind per object is enough to read; a broken run would otherwise print
        // the same line on every step.
        if self
            .found
            .iter()
            .any(|v| v.invariant == invariant && v.detail == detail)
        {
            return;
        }
        self.found.push(Violation {
            at,
            invariant,
            detail,
        });
    }
}

/// The global decisions of one mapping, as agents must agree on them.
type Decision = (String, Option<String>, Option<String>, Option<String>);

/// What the agents decided, recorded by each pass.
#[derive(Debug, Default)]
pub struct Observations {
    /// The first node's decisions for each snapshot seen (by the snapshot's fingerprint).
    by_snapshot: BTreeMap<u64, (String, Vec<Decision>)>,
    /// Passes recorded.
    pub passes: u64,
    /// Broken invariants seen in passes: (invariant, detail).
    pub found: Vec<(&'static str, String)>,
}

/// A fingerprint of the objects a snapshot holds (kind, namespace, name, resourceVersion) and
/// the CNI facts: two agents with the same fingerprint saw the same cluster.
fn fingerprint(snapshot: &Snapshot) -> u64 {
    fn meta<K: kube::Resource>(kind: &str, items: &[K], h: &mut impl Hasher) {
        for o in items {
            let m = o.meta();
            (kind, &m.namespace, &m.name, &m.resource_version).hash(h);
        }
    }
    // Fixed keys: the fingerprint is the same in every process.
    let mut h = std::hash::DefaultHasher::new();
    meta("class", &snapshot.classes, &mut h);
    meta("portmap", &snapshot.portmaps, &mut h);
    meta("slice", &snapshot.endpoint_slices, &mut h);
    meta("node", &snapshot.nodes, &mut h);
    meta("namespace", &snapshot.namespaces, &mut h);
    format!("{:?}", snapshot.cni).hash(&mut h);
    h.finish()
}

fn decisions(plan: &Plan) -> Vec<Decision> {
    plan.portmaps
        .iter()
        .map(|d| {
            (
                format!("{}/{}", d.namespace, d.name),
                d.endpoint.as_ref().map(|e| format!("{e:?}")),
                d.serving_node.as_deref().map(str::to_owned),
                d.status_writer.as_deref().map(str::to_owned),
            )
        })
        .collect()
}

impl Observations {
    /// Records one pass of `node`, checking agreement with any other node that saw the same
    /// snapshot, and that the node writes only the statuses its own plan makes it the writer of.
    pub fn record(&mut self, node: &str, snapshot: &Snapshot, plan: &Plan) {
        self.passes += 1;
        let mine = decisions(plan);
        match self.by_snapshot.get(&fingerprint(snapshot)) {
            Some((other, theirs)) if other != node && *theirs != mine => {
                let differ = mine
                    .iter()
                    .zip(theirs)
                    .find(|(a, b)| a != b)
                    .map(|(a, b)| format!("{node} decided {a:?}, {other} decided {b:?}"))
                    .unwrap_or_else(|| format!("{node} and {other} decided different mappings"));
                self.found.push(("agreement", differ));
            }
            Some(_) => {}
            None => {
                self.by_snapshot
                    .insert(fingerprint(snapshot), (node.to_owned(), mine));
            }
        }
        for write in &plan.writes.portmaps {
            if let Some(detail) = unacknowledged(snapshot, write) {
                self.found
                    .push(("acknowledged", format!("{node} writes {detail}")));
            }
            let writer = plan
                .portmaps
                .iter()
                .find(|d| d.namespace == write.namespace && d.name == write.name)
                .and_then(|d| d.status_writer.as_deref());
            if writer != Some(node) {
                self.found.push((
                    "single writer",
                    format!(
                        "{node} writes the status of PortMap {}/{} whose writer is {writer:?}",
                        write.namespace, write.name
                    ),
                ));
            }
        }
    }
}

/// A `Programmed=True` write for a mapping whose pod's node, or a node it is published on, had
/// not acknowledged their return link (both ends listing it at its claimed slot) in the
/// snapshot the writer planned from: what the write claims, if it claims too much.
fn unacknowledged(snapshot: &Snapshot, write: &PortMapWrite) -> Option<String> {
    let programmed = write
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Programmed")?;
    if programmed.status != "True" {
        return None;
    }
    let pod_node = write.status.endpoint.as_ref()?.node.as_str();
    let class_name = &snapshot
        .portmaps
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(&write.namespace)
                && p.metadata.name.as_deref() == Some(&write.name)
        })?
        .spec
        .class_name;
    let class = snapshot
        .classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(class_name))?;
    let status = class.status.clone().unwrap_or_default();
    let lists = |end: &str, peer: &str, slot: i32| {
        status
            .nodes
            .iter()
            .any(|r| r.name == end && r.links.iter().any(|l| l.peer == peer && l.slot == slot))
    };
    let mut published: Vec<&str> = write
        .status
        .published
        .iter()
        .map(|p| p.node.as_str())
        .filter(|n| *n != pod_node)
        .collect();
    published.dedup();
    for node in published {
        let key = NodePair::new(node, pod_node)?.to_string();
        let slot = status.links.iter().find(|c| c.key == key).map(|c| c.slot);
        let acked =
            slot.is_some_and(|slot| lists(node, pod_node, slot) && lists(pod_node, node, slot));
        if !acked {
            return Some(format!(
                "Programmed=True for PortMap {}/{} although link {key} is not acknowledged by both ends",
                write.namespace, write.name
            ));
        }
    }
    None
}
